"""torchbridge: PyTorch models and functions as TensorFlow ops and modules."""

# The one thing done at import, first: load triton's native library (if
# installed) so that TensorFlow's global LLVM symbols cannot capture it (see
# _load_order.py); then torch before TensorFlow, the order every module keeps.
from torchbridge._frameworks import _load_order

_load_order.load_before_tensorflow()

# pylint: disable=g-import-not-at-top,wrong-import-position
from torchbridge._crossing._stats import exchange_stats
from torchbridge._crossing._stats import reset_exchange_stats
from torchbridge._crossing._exchange import to_tf
from torchbridge._crossing._exchange import to_torch
from torchbridge._wrappers._function import torch_function
from torchbridge._wrappers._module import TorchModule
from torchbridge._native._loader import native_available
from torchbridge._runtime._timeline import timeline

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time, imported on first use (see __getattr__)
  from torchbridge._translate._errors import ParityError
  from torchbridge._translate._errors import UntranslatedOpsError
  from torchbridge._translate._translated import Translated
  from torchbridge._translate._translated import translate
  from torchbridge._capture._guard import StaleCaptureError

__all__ = [
  "ParityError",
  "StaleCaptureError",
  "TorchModule",
  "Translated",
  "UntranslatedOpsError",
  "exchange_stats",
  "native_available",
  "reset_exchange_stats",
  "timeline",
  "to_tf",
  "to_torch",
  "torch_function",
  "translate",
]

__version__ = "0.1.0"


# Imported when first used: `tb.translate` brings torch.export (0.8 s).
_TRANSLATE_NAMES = ("ParityError", "Translated", "UntranslatedOpsError", "translate")


def __getattr__(name: str) -> Any:
  # `tb.keras` and `tb.ray` import Keras / Ray only when first used.
  import importlib

  if name in ("keras", "ray"):
    return importlib.import_module(f"torchbridge.{name}")
  if name in ("ParityError", "UntranslatedOpsError"):
    return getattr(importlib.import_module("torchbridge._translate._errors"), name)
  if name in _TRANSLATE_NAMES:
    return getattr(importlib.import_module("torchbridge._translate._translated"), name)
  if name == "StaleCaptureError":  # raised by a graph call whose capture went stale
    return importlib.import_module("torchbridge._capture._guard").StaleCaptureError
  raise AttributeError(f"module 'torchbridge' has no attribute {name!r}")
