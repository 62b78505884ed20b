"""Ray for torchbridge: ship `TorchModule` weights to actors, train data-parallel.

Needs Ray (`pip install ray`, or `pip install ".[ray]"` in a clone); `import torchbridge` alone never
imports it.
"""

from torchbridge.ray._trainer import DataParallelTrainer
from torchbridge.ray._weights import broadcast_weights
from torchbridge.ray._weights import pull_weights
from torchbridge.ray._weights import put_weights
from torchbridge.ray._worker import TorchModuleWorker

__all__ = [
  "DataParallelTrainer",
  "TorchModuleWorker",
  "broadcast_weights",
  "pull_weights",
  "put_weights",
]
