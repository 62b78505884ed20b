"""`torch.compile`d code during the bridge's own probing runs.

The bridge runs a forward in two special ways: on `meta` tensors while a
`tf.function` is traced (to learn the output shapes, `_signature.py`), and
once per mode under a `TorchDispatchMode` that records which buffers the
forward writes (`_torch_state.py`). Compiled code must not compile there:
there is nothing to gain from compiling for meta tensors, and torch 2.13's
dynamo, on meeting a frame while a dispatch mode is active, marks that code
"skip" for good, so the module would silently run uncompiled ever after
(measured). Under torch's `force_eager` stance compiled code runs eagerly and
is compiled on its next ordinary call.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

_lock = threading.Lock()
_depth = 0
_stance: Any = None  # torch's stance context manager, while entered


@contextlib.contextmanager
def run_uncompiled() -> Iterator[None]:
  """Runs `torch.compile`d code eagerly inside, without marking it skipped.

  Process-wide while any thread is inside (torch's stance is global): other
  threads' compiled calls meanwhile run eagerly too, which is only slower.
  A no-op when nothing was compiled (dynamo never imported).
  """
  global _depth, _stance  # pylint: disable=global-statement
  if "torch._dynamo" not in sys.modules or not hasattr(torch.compiler, "set_stance"):
    yield
    return
  with _lock:
    if _depth == 0:
      _stance = torch.compiler.set_stance("force_eager")
      _stance.__enter__()
    _depth += 1
  try:
    yield
  finally:
    with _lock:
      _depth -= 1
      if _depth == 0:
        stance, _stance = _stance, None
        stance.__exit__(None, None, None)


def _reset_after_fork() -> None:
  global _lock, _depth, _stance  # pylint: disable=global-statement
  _lock, _depth, _stance = threading.Lock(), 0, None


if hasattr(os, "register_at_fork"):
  os.register_at_fork(after_in_child=_reset_after_fork)
