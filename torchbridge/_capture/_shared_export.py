"""One `torch.export` per call signature, shared by every runner that
captures it.

A graph call's dispatch (`_runners/_choose.py`) opens one `SharedExport`
per signature it captures: the TF runner lowers it to the ops TF
translates, and where the translation does not hold, the C++ torch runner
lowers the same export to torch's own ops; neither exports again. A
refusal of torch.export is kept the same way, so the second runner takes
it without a second try. The export holds the module's tensors (views of
the variables, lent while it is captured) and is dropped when the
dispatch ends: kept longer, TF would copy each variable on its next
update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._state import _torch_state
from torchbridge._translate import _export
from torchbridge._translate import _export_errors
from torchbridge._translate import _inputs
from torchbridge._translate import _refusal


class FlatCall(torch.nn.Module):
  """The module called with the call's flat tensors (the exported inputs)."""

  def __init__(self, module: torch.nn.Module, substitute: Callable[..., Any]) -> None:
    super().__init__()
    self.module = module
    self._substitute = substitute

  def forward(self, *args_torch: torch.Tensor) -> Any:
    args, kwargs = self._substitute(list(args_torch))
    return self.module(*args, **kwargs)


class SharedExport:
  """The export of one call signature, made on the first `lowered` (inside
  a capture, with the module held) and lowered for each runner."""

  exports = 0  # torch.export runs of the process (tests count them)

  def __init__(self, state: _torch_state.TorchState, call: Any) -> None:
    self._state = state
    self.flat = FlatCall(state.module, call.substitute)
    self.specs = [tf.TensorSpec(a.shape, a.dtype) for a in call.args_tf]
    self._program_torch: torch.export.ExportedProgram | None = None
    self._refusal: _refusal.Refusal | None = None

  def lowered(self, decompose: bool) -> _export.Program:
    """The program with the ops TF translates (`decompose=True`), or with
    torch's own ops functionalized (the C++ runner's); buffers the forward
    writes are its leading outputs.

    Raises:
      Refusal: torch.export, or its lowering, refused (what="export").
    """
    if self._refusal is None and any(s.shape.rank is None for s in self.specs):
      self._refusal = _refusal.Refusal(
        "export",
        "an argument has an unknown rank while tracing; give the tf.function an "
        "input_signature with known ranks",
      )
    if self._refusal is not None:
      raise self._refusal
    name = self._state.name
    if self._program_torch is None:
      examples = _inputs.random_inputs(self.specs, 0, seed=0)
      SharedExport.exports += 1
      try:
        self._program_torch = _export.export_program(
          self.flat, self.specs, examples, name, varargs=True
        )
      except _export_errors.ExportError as err:
        self._refusal = _refusal.Refusal("export", err.summary, err.detail)
        raise self._refusal from err
    try:
      return _export.lower(
        self._program_torch,
        self.specs,
        name,
        allow_writes=True,
        decompose=decompose,
        prefix="module.",  # FlatCall's
      )
    except _export_errors.ExportError as err:
      raise _refusal.Refusal("export", err.summary, err.detail) from err
    except ValueError as err:  # the lowering's own checks (dynamic dimensions)
      raise _refusal.Refusal("export", str(err)) from err

  def close(self) -> None:
    """Drops the export (and the module tensors it holds)."""
    self._program_torch = None
