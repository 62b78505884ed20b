"""`Refusal`: why a call cannot run on a runner, the one type every part
of the capture raises (an op the translation lacks, torch.export's
refusal, a failed parity check, a node the C++ runner cannot call)."""

from __future__ import annotations

# What refused, as a user reads it (`Refusal.what` -> words).
WHAT = {
  "op": "an op has no TF translation",
  "export": "torch.export could not capture the forward",
  "check": "the capture failed its check against torch",
  "translation": "an op's translation raised",
  "runner": "the C++ torch runner cannot run it",
}


class Refusal(Exception):
  """Why a call cannot run on a runner.

  Attributes:
    what: one of `WHAT`'s keys.
    reason: one sentence.
    detail: torch's whole error, where there is one (logged at DEBUG).
  """

  def __init__(self, what: str, reason: str, detail: str = "") -> None:
    super().__init__(reason)
    assert what in WHAT, what
    self.what = what
    self.reason = reason
    self.detail = detail

  def said(self) -> str:
    """`what` and `reason` as one clause: "an op has no TF translation: ..."."""
    return f"{WHAT[self.what]}: {self.reason}"
