"""Which runner each module's graph calls took, for `info` and `timeline`.

Written by the runner choice (`_state/_runner.py`) once per module and
signature; read by `tb.timeline()` (its `runners`) and by `python -m
torchbridge info` (the modules of the process that asks).
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_choices: dict[str, dict[str, Any]] = {}


def record(
  module: str,
  runner: str,
  reason: str = "",
  capture_s: float | None = None,
  path: str | None = None,
  path_reason: str = "",
) -> None:
  """Notes that `module`'s latest graph call took `runner` ("tf": its TF
  translation; "torch": the bridge), and why when it is not "tf"; for
  "torch", `path` says how: "C++" (the captured program run from the op)
  or "Python" (the forward's Python on every call; `path_reason` says
  why)."""
  entry: dict[str, Any] = {"runner": runner, "reason": reason}
  if path is not None:
    entry["path"] = path
  if path_reason:
    entry["path_reason"] = path_reason
  if capture_s is not None:
    entry["capture_s"] = round(capture_s, 4)
  with _lock:
    _choices[module] = entry


def choices() -> dict[str, dict[str, Any]]:
  """`{module name: {"runner": "tf" | "torch", "reason": str, ...}}`
  ("path": "C++" | "Python" for "torch")."""
  with _lock:
    return {k: dict(v) for k, v in _choices.items()}
