"""Which runner each module's graph calls took, for `info` and `timeline`,
and the one line that says so.

Written by the dispatch (`_choose.py`) once per module and signature,
keyed by the module (two modules of one name keep an entry each); read by
`tb.timeline()` (its `runners`) and by `python -m torchbridge info` (the
modules of the process that asks), by name: where several live modules
share one, the latest recorded has it and the others `name #2`, `#3`.
A reason is one sentence (`one_line`); torch's whole error, where there is
one, is the record's `detail` and goes to the log at DEBUG (`say_once`).
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import weakref
from typing import Any

from torchbridge._runtime import _timeline

LOG = logging.getLogger("torchbridge")
_LONGEST = 300  # characters of a reason in a log line or a record

_lock = threading.Lock()
# module's state -> (sequence number of its latest record, its name, entry)
_choices: weakref.WeakKeyDictionary[Any, tuple[int, str, dict[str, Any]]] = (
  weakref.WeakKeyDictionary()
)
_sequence = itertools.count()


def record(
  owner: Any,
  name: str,
  runner: str,
  reason: str = "",
  capture_s: float | None = None,
  path: str | None = None,
  path_reason: str = "",
  detail: str = "",
) -> None:
  """Notes that the latest graph call of `owner` (a module's state, named
  `name`) took `runner` ("tf": its TF
  translation; "torch": the bridge), and why when it is not "tf"; for
  "torch", `path` says how: "C++" (the captured program run from the op)
  or "Python" (the forward's Python on every call; `path_reason` says
  why). Reasons are made one line; `detail` is torch's whole error behind
  the latest of them."""
  entry: dict[str, Any] = {"runner": runner, "reason": one_line(reason)}
  if path is not None:
    entry["path"] = path
  if path_reason:
    entry["path_reason"] = one_line(path_reason)
  with _lock:
    previous = _choices.get(owner, (0, "", {}))[2]
  same = all(previous.get(k, "") == entry.get(k, "") for k in ("reason", "path_reason"))
  if not detail and same:  # a later signature, for the same reason
    detail = previous.get("detail", "")
  if detail:
    entry["detail"] = detail
  if capture_s is not None:
    entry["capture_s"] = round(capture_s, 4)
  with _lock:
    _choices[owner] = (next(_sequence), name, entry)


def choices() -> dict[str, dict[str, Any]]:
  """`{module name: {"runner": "tf" | "torch", "reason": str, ...}}`
  ("path": "C++" | "Python" for "torch"), the latest recorded first."""
  with _lock:
    latest_first = sorted(_choices.values(), key=lambda e: -e[0])
  named: dict[str, dict[str, Any]] = {}
  for _, name, entry in latest_first:
    shown, k = name, 1
    while shown in named:
      k += 1
      shown = f"{name} #{k}"
    named[shown] = dict(entry)
  return named


_timeline.report_runners(choices)


def one_line(reason: str, limit: int = _LONGEST) -> str:
  """`reason` as one line a user reads: its first line that says something,
  spaces collapsed, cut at `limit` characters.

  >>> one_line("Could not export.\\n\\nFor more information, run with ...")
  'Could not export.'
  """
  for line in reason.splitlines():
    line = re.sub(r"\s+", " ", line).strip()
    if line:
      return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."
  return ""


def say_once(said: set[str], level: int, message: str, detail: str = "") -> None:
  """Logs `message` (one line) at `level` once per `said`, and `detail`
  (torch's whole error) at DEBUG on the same logger after it."""
  message = one_line(message, limit=3 * _LONGEST)  # its reason was cut already
  if message in said:
    return
  said.add(message)
  LOG.log(level, message)
  if detail:
    LOG.debug("%s\n%s", message, detail)
