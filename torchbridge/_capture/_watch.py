"""The Python state a captured forward may have read, and changes to it.

A capture bakes the module's plain Python attributes into its graph (an
exploration scale, a flag). `snapshot` records them when the capture is
made; `first_change` names the first one that differs since. Watched, for
every submodule: each public instance attribute holding a bool, int,
float, complex, str, bytes, None, or a tuple, list, dict or set of those
(compared by value); each plain tensor attribute that is neither a
parameter nor a buffer (by identity and in-place version); the submodules
themselves (by identity); the forward hooks and pre-hooks registered on it.
Their train/eval flags are part of a capture's key instead; a graph that
took them from the module (`training=None`) is held to them by `Modes`.
Not watched: attributes of other objects (a config object's fields),
globals, closures, class attributes and random state.
"""

from __future__ import annotations

import copy
import operator
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
        if attr.startswith("_") or attr == "training":
          # The modes are part of the capture's key (and `Modes` holds a
          # graph traced with training=None to them).
          continue
        if isinstance(value, torch.Tensor):
          self._entries.append((prefix + attr, d, attr, (value, value._version), "tensor"))
        elif _is_plain(value):
          self._entries.append((prefix + attr, d, attr, copy.deepcopy(value), "value"))
      for table in ("_modules", "_forward_hooks", "_forward_pre_hooks"):
        held = d.get(table)
        if held is not None:
          self._tables.append((f"{prefix}{table}", held, self._own(held)))
    self._fast_check()

  def _fast_check(self) -> None:
    """The same entries, laid out for `_unchanged`: a check before each
    call of a graph (`_guard.add_guard`) that does its comparisons in C."""
    # The tables (submodules, hooks; torchbridge's own included) and copies
    # of them: one list comparison, dict by dict, entry by entry.
    self._live_tables = [table for _, table, _ in self._tables]
    self._table_copies = [dict(table) for table in self._live_tables]
    # Plain values, grouped by the __dict__ holding them: (the dict, a getter
    # of their attributes, their values as captured, their types).
    groups: dict[int, tuple[dict[str, Any], list[str], list[Any]]] = {}
    self._tensors: list[tuple[dict[str, Any], str, torch.Tensor, int]] = []
    for _, d, attr, captured, kind in self._entries:
      if kind == "tensor":
        tensor, version = captured
        self._tensors.append((d, attr, tensor, version))
      else:
        _, attrs, values = groups.setdefault(id(d), (d, [], []))
        attrs.append(attr)
        values.append(captured)
    self._values = [
      (d, operator.itemgetter(*attrs, attrs[0]), (*values, values[0]), tuple(map(type, values)))
      for d, attrs, values in groups.values()
    ]

  def _unchanged(self) -> bool:
    """True only if nothing watched changed; False where `first_change`
    must look (it names the change, or finds none)."""
    try:
      if self._live_tables != self._table_copies:
        return False
    except Exception:  # pylint: disable=broad-except
      return False  # a hook whose == raises: compared by identity below
    for d, get, captured, types in self._values:
      try:
        now = get(d)  # a tuple, the first value repeated last (never a bare value)
      except KeyError:
        return False
      # Tuples compare by identity, then by ==; the types as `_equal` does.
      if now != captured or tuple(map(type, now[:-1])) != types:
        return False
    for d, attr, tensor, version in self._tensors:
      if d.get(attr) is not tensor or tensor._version != version:
        return False
    return True

  def _own(self, table: dict[Any, Any]) -> dict[Any, Any]:
    """The table's entries less torchbridge's own hooks."""
    if not table:
      return {}
    return {k: v for k, v in table.items() if id(v) not in self._ignored}

  def first_change(self) -> str | None:
    """The first watched attribute that changed, as `path: old -> new`."""
    if self._unchanged():
      return None
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


class Modes:
  """Torch's train/eval flags of a module's submodules, as a graph traced
  with `training=None` took them: `first_change` names the first one
  flipped since (`module.eval()`, `module.train()`, a submodule's own).

  Such a graph runs every runner (the TF translation, torch from C++, the
  forward's Python) in the modes it was traced with, so a check before each
  call (`_guard.add_guard`) refuses it once they changed."""

  def __init__(self, named_modules: Sequence[tuple[str, torch.nn.Module]]) -> None:
    self._named = list(named_modules)
    self._modules = [m for _, m in self._named]
    self.captured = [m.training for m in self._modules]

  def first_change(self) -> str | None:
    """`training was True when traced, False now`, naming the submodules
    when not all of them flipped; None while every flag is as traced."""
    if [m.training for m in self._modules] == self.captured:
      return None
    flipped = [
      (path, was) for (path, m), was in zip(self._named, self.captured) if m.training != was
    ]
    _, was = flipped[0]
    where = ""
    if len(flipped) < len(self._named):
      shown = ", ".join(f"submodule {p!r}" if p else "the module itself" for p, _ in flipped[:3])
      more = f" and {len(flipped) - 3} more" if len(flipped) > 3 else ""
      where = f" ({shown}{more})"
    return f"training was {was} when traced, {not was} now{where}"
