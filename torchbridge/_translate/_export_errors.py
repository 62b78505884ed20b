"""torch.export's refusals as one sentence, with torch's whole error kept.

torch.export's errors run to dozens of lines (its debugging advice, symbol
names, links), and on some it prints the partial FX graph to stderr
itself. A user reads one sentence: `summary` (what torch could not do, and
where in their code); torch's own text is `ExportError.detail`, for the
log at DEBUG and `python -m torchbridge info`.

Example:
  >>> err = RuntimeError("Could not guard on data-dependent expression u0\\n"
  ...   "The following call raised this error:\\n"
  ...   '  File "/src/net.py", line 67, in forward\\n'
  ...   "    out, state = self.lstm(packed, state)\\n")
  >>> summary(err)
  'the code depends on tensor values (a data-dependent size or branch) at `out, state = self.lstm(packed, state)` (net.py:67)'
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

_CALL_SITE = re.compile(
  r"The following call raised this error:\s*\n\s*File \"(?P<file>[^\"]+)\", line "
  r"(?P<line>\d+), in \w+\s*\n\s*(?P<code>[^\n]+)"
)
_DATA_DEPENDENT = ("data-dependent", "data dependent", "GuardOnDataDependentSymNode")


class ExportError(ValueError):
  """torch.export refused a module: `str()` is one sentence with the fix,
  `summary` what torch could not do, `detail` torch's own error (and the
  partial graph it printed, if any)."""

  def __init__(self, message: str, summary: str, detail: str) -> None:
    super().__init__(message)
    self.summary = summary
    self.detail = detail


def summary(err: BaseException) -> str:
  """What torch.export could not do, in one sentence naming the user's line
  where torch says which."""
  text = str(err)
  site = _CALL_SITE.search(text)
  where = ""
  if site:
    where = f" at `{site['code'].strip()}` ({os.path.basename(site['file'])}:{site['line']})"
  if any(marker in text or marker in type(err).__name__ for marker in _DATA_DEPENDENT):
    return f"the code depends on tensor values (a data-dependent size or branch){where}"
  first = next((line.strip() for line in text.splitlines() if line.strip()), "")
  return f"{type(err).__name__}: {first}{where}"


def detail(err: BaseException, printed: str) -> str:
  """torch's whole error, then what it printed to stderr while exporting."""
  text = f"{type(err).__name__}: {err}"
  if printed.strip():
    text += f"\n\ntorch.export printed:\n{printed.rstrip()}"
  return text


class _StderrOfOthers:
  """`sys.stderr` for every thread but one, whose writes are kept."""

  def __init__(self, real: Any, thread: int) -> None:
    self._real = real
    self._thread = thread
    self.kept: list[str] = []

  def write(self, text: str) -> int:
    if threading.get_ident() == self._thread:
      self.kept.append(text)
      return len(text)
    return self._real.write(text)

  def __getattr__(self, name: str) -> Any:
    return getattr(self._real, name)


@contextlib.contextmanager
def stderr_kept() -> Iterator[list[str]]:
  """Keeps what this thread writes to `sys.stderr` (torch.export prints the
  partial FX graph of a failed export there) in the list it yields; other
  threads' writes pass through."""
  real = sys.stderr
  quiet = _StderrOfOthers(real, threading.get_ident())
  sys.stderr = quiet
  try:
    yield quiet.kept
  finally:
    if sys.stderr is quiet:  # else someone replaced it since: theirs stays
      sys.stderr = real
