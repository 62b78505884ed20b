"""The Python state a captured forward may have read, and changes to it.

A capture bakes the module's plain Python attributes into its graph (an
exploration scale, a flag). `snapshot` records them when the capture is
made; `first_change` names the first one that differs since. Watched, for
every submodule: each public instance attribute holding a bool, int,
float, complex, str, bytes, None, or a tuple, list, dict or set of those
(compared by value); each plain tensor attribute that is neither a
parameter nor a buffer (by identity and in-place version); the submodules
themselves (by identity); the forward hooks and pre-hooks registered on it. Not
its train/eval flag: the modes are part of a capture's key, and a graph
keeps the modes it was traced with.
Not watched: attributes of other objects (a config object's fields),
globals, closures, class attributes and random state.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

_PLAIN = (bool, int, float, complex, str, bytes, type(None))
_MISSING = object()


def _is_plain(value: Any, depth: int = 0) -> bool:
  if isinstance(value, _PLAIN):
    return True
  if depth < 3 and isinstance(value, (tuple, list, set, frozenset)):
    return all(_is_plain(v, depth + 1) for v in value)
  if depth < 3 and isinstance(value, dict):
    return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
  return False


class Snapshot:
  """What the forward could read when a capture was made."""

  def __init__(
    self,
    named_modules: Sequence[tuple[str, torch.nn.Module]],
    watch_mode: bool,
    ignored: frozenset[int] = frozenset(),
  ) -> None:
    self._ignored = ignored  # ids of torchbridge's own hooks
    # (path, a table of submodules or hooks, its entries as captured)
    self._tables: list[tuple[str, dict[Any, Any], dict[Any, Any]]] = []
    # (path, the module's __dict__, attribute, value as captured, kind)
    self._entries: list[tuple[str, dict[str, Any], str, Any, str]] = []
    for path, m in named_modules:
      d = m.__dict__
      prefix = f"{path}." if path else ""
      for attr, value in d.items():
        if attr.startswith("_") or (attr == "training" and not watch_mode):
          # The modes are part of the capture's key; a graph keeps the
          # modes it was traced with (TorchModule's documented rule).
          continue
        if isinstance(value, torch.Tensor):
          self._entries.append((prefix + attr, d, attr, (value, value._version), "tensor"))
        elif _is_plain(value):
          self._entries.append((prefix + attr, d, attr, copy.deepcopy(value), "value"))
      for table in ("_modules", "_forward_hooks", "_forward_pre_hooks"):
        held = d.get(table)
        if held is not None:
          self._tables.append((f"{prefix}{table}", held, self._own(held)))

  def _own(self, table: dict[Any, Any]) -> dict[Any, Any]:
    """The table's entries less torchbridge's own hooks."""
    if not table:
      return {}
    return {k: v for k, v in table.items() if id(v) not in self._ignored}

  def first_change(self) -> str | None:
    """The first watched attribute that changed, as `path: old -> new`."""
    for path, table, held in self._tables:
      if table or held:
        now = self._own(table)
        if len(now) != len(held) or any(held.get(k) is not v for k, v in now.items()):
          what = "submodules" if path.endswith("_modules") else "hooks"
          return f"{path} (its {what} changed)"
    for path, d, attr, captured, kind in self._entries:
      value = d.get(attr, _MISSING)
      if kind == "tensor":
        tensor, version = captured
        if value is not tensor or tensor._version != version:
          return f"{path} (a tensor attribute, replaced or written in place)"
        continue
      if value is captured or (value is not _MISSING and _equal(value, captured)):
        continue
      shown = "deleted" if value is _MISSING else repr(value)
      return f"{path}: {captured!r} when captured, {shown} now"
    return None


def _equal(a: Any, b: Any) -> bool:
  try:
    return type(a) is type(b) and bool(a == b)
  except Exception:  # pylint: disable=broad-except
    return False
