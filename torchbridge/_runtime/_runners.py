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


def record(module: str, runner: str, reason: str = "", capture_s: float | None = None) -> None:
  """Notes that `module`'s latest graph call took `runner` ("tf": its TF
  translation; "torch": the bridge), and why when it is not "tf"."""
  entry: dict[str, Any] = {"runner": runner, "reason": reason}
  if capture_s is not None:
    entry["capture_s"] = round(capture_s, 4)
  with _lock:
    _choices[module] = entry


def choices() -> dict[str, dict[str, Any]]:
  """`{module name: {"runner": "tf" | "torch", "reason": str, ...}}`."""
  with _lock:
    return {k: dict(v) for k, v in _choices.items()}
