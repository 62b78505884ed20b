"""The errors of a translation: an op without one, a result that differs
from torch's, an op's translation that raised; and their messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UNTRANSLATED = """\
translate({name!r}): {count} op(s) of this model have no TensorFlow
translation:
{ops}
The way out: keep calling the module through the bridge
(`tb.TorchModule` / `tb.keras.TorchLayer`), which runs any torch code but
needs torch and Python at run time; or change the model to use ops with a
translation (the guide "Serving with tb.translate" lists them, under Coverage)."""

MISMATCH = """\
translate({name!r}): the TF graph does not compute what torch computes on
the example input (largest |tf - torch| per output, with the tolerance
atol + rtol * |torch|):
{rows}
This is a bug in the translation of one of the model's ops: please report
it with the model. Until then, keep calling the module through the bridge,
or pass looser rtol/atol if the difference is expected (e.g. float16)."""

FAILED = """\
translate({name!r}): the translation of an op raised on this model:
  {error}
This is a bug of torchbridge's translation, not a missing op: please report
it with the model. Until then, keep calling the module through the bridge
(`tb.TorchModule` / `tb.keras.TorchLayer`)."""


class UntranslatedOpsError(NotImplementedError):
  """Some ops of a model have no TF translation (all are listed).

  Raised by `translate`, and by a graph call of a
  `TorchModule(..., run="tf")` whose forward has such an op (there the
  message names the ops, and `ops` is absent). A `NotImplementedError`.

  Args:
    message: the error message, naming every op and the way out.
    ops: `{op: reason}`, kept as the `ops` attribute.

  Attributes:
    ops (dict[str, str]): maps each op (`aten.<name>.<overload>`, with the
      node where it was met when known) to the reason.

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> class Spectrum(torch.nn.Module):
    ...   def __init__(self):
    ...     super().__init__()
    ...     self.scale = torch.nn.Parameter(torch.ones(4))
    ...   def forward(self, x):
    ...     return torch.fft.fft(x * self.scale).real
    >>> try:
    ...   tb.translate(tb.TorchModule(Spectrum()), [tf.TensorSpec([2, 4])])
    ... except tb.UntranslatedOpsError as err:
    ...   print(sorted(err.ops)[0].split(" ")[0])
    aten._fft_r2c.default
  """

  def __init__(self, message: str, ops: Mapping[str, Any] | None = None) -> None:
    super().__init__(message)
    self.ops = dict(ops or {})


class ParityError(ValueError):
  """The translated graph's outputs differ from torch's beyond tolerance.

  Raised by `translate`, whose message names each output and its largest
  difference; `rtol=` and `atol=` set the tolerance; and by a graph call
  of a `TorchModule(..., run="tf")` whose translation fails its check.
  A `ValueError`, so `except ValueError` catches it too.

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> issubclass(tb.ParityError, ValueError)
    True
    >>> try:
    ...   raise tb.ParityError("output 0 differs by 0.5")
    ... except ValueError as err:
    ...   print(type(err).__name__, err)
    ParityError output 0 differs by 0.5
  """

  __init__ = Exception.__init__  # re-raised as itself by AutoGraph
