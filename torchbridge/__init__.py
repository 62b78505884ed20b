"""torchbridge: PyTorch models and functions as TensorFlow ops and modules."""

from torchbridge._exchange import exchange_stats
from torchbridge._exchange import reset_exchange_stats
from torchbridge._exchange import to_tf
from torchbridge._exchange import to_torch
from torchbridge._function import torch_function
from torchbridge._module import TorchModule
from torchbridge._native import native_available

__all__ = [
    "TorchModule",
    "exchange_stats",
    "native_available",
    "reset_exchange_stats",
    "to_tf",
    "to_torch",
    "torch_function",
]

__version__ = "0.1.0"


def __getattr__(name):
  # `tb.keras` and `tb.ray` import Keras / Ray only when first used.
  if name in ("keras", "ray"):
    import importlib
    return importlib.import_module(f"torchbridge.{name}")
  raise AttributeError(f"module 'torchbridge' has no attribute {name!r}")
