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

A large module's signature is exported, lowered and checked at a symbolic
batch size where torch.export keeps the batch dimension symbolic (every
argument of the same leading size, 4 or more): the check then runs at a
batch of 3, not the call's, and the runners run the symbolic program at
the call's size. Where torch specializes the batch, the signature is
exported again at its own sizes and checked there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._capture import _disk
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


# Parameters (elements) from which a signature is checked at a smaller
# batch: BERT-base's check at its call's batch of 8 x 128 cost about two
# training steps (benchmarks/results/first_call_breakdown.json).
SMALL_BATCH_PARAMETERS = 1_000_000
SMALL_BATCH = 3  # the batch it is checked at (`_inputs.random_inputs` size 1)


class SharedExport:
  """The export of one call signature, made on the first `lowered` (inside
  a capture, with the module held) and lowered for each runner.

  `specs` are what it is exported for: the call's, or with the batch
  dimension unknown where `batch` (the call's batch size) is set;
  `check_sizes` the `_inputs.random_inputs` sizes its check runs at."""

  exports = 0  # torch.export runs of the process (tests count them)

  def __init__(self, state: _torch_state.TorchState, call: Any, signature: Any = None) -> None:
    self._state = state
    self._signature = signature  # its key among the captures (None: none kept on disk)
    self._lowered: dict[bool, torch.export.ExportedProgram] = {}
    self._read_from_disk: set[str] = set()
    self.flat = FlatCall(state.module, call.substitute)
    self.call_specs = [tf.TensorSpec(a.shape, a.dtype) for a in call.args_tf]
    self.batch = (
      _batch_size(self.call_specs) if _parameters(state) >= SMALL_BATCH_PARAMETERS else None
    )
    self.specs = self.call_specs
    if self.batch is not None:
      self.specs = [tf.TensorSpec([None] + s.shape.as_list()[1:], s.dtype) for s in self.call_specs]
    self._program_torch: torch.export.ExportedProgram | None = None
    self._refusal: _refusal.Refusal | None = None

  @property
  def check_sizes(self) -> tuple[int, ...] | None:
    """The check's sizes: one batch of `SMALL_BATCH` where the batch is
    symbolic, else None (the check's own choice)."""
    return (SMALL_BATCH - 2,) if self.batch is not None else None

  def lowered(self, decompose: bool) -> _export.Program:
    """The program with the ops TF translates (`decompose=True`), or with
    torch's own ops functionalized (the C++ runner's); buffers the forward
    writes are its leading outputs.

    Raises:
      Refusal: torch.export, or its lowering, refused (what="export").
    """
    self.exported()
    try:
      return self._lower(decompose)
    except _refusal.Refusal:
      if self.batch is None:
        raise
      self._at_call_sizes()  # torch specialized the batch in decomposing
      self._make_export()
      return self._lower(decompose)

  def exported(self) -> torch.export.ExportedProgram:
    """torch.export's program, exported on the first call.

    Raises:
      Refusal: torch.export refused (what="export").
    """
    if self._refusal is None and any(s.shape.rank is None for s in self.specs):
      self._refusal = _refusal.Refusal(
        "export",
        "an argument has an unknown rank while tracing; give the tf.function an "
        "input_signature with known ranks",
      )
    if self._refusal is not None:
      raise self._refusal
    if self._program_torch is None:
      self._make_export()
    assert self._program_torch is not None
    return self._program_torch

  def _make_export(self) -> None:
    try:
      self._program_torch = self._exported()
      if self.batch is not None and not _batch_kept(self._program_torch, self.batch):
        self._at_call_sizes()
        self._program_torch = self._exported()
    except _export_errors.ExportError as err:
      if self.batch is None:
        self._refusal = _refusal.Refusal("export", err.summary, err.detail)
        raise self._refusal from err
      self._at_call_sizes()
      self._make_export()

  def _exported(self) -> torch.export.ExportedProgram:
    SharedExport.exports += 1
    examples = _inputs.random_inputs(self.specs, 0, seed=0)
    return _export.export_program(self.flat, self.specs, examples, self._state.name, varargs=True)

  def _at_call_sizes(self) -> None:
    self.batch = None
    self.specs = self.call_specs
    self._program_torch = None

  def _lower(self, decompose: bool) -> _export.Program:
    assert self._program_torch is not None
    name = self._state.name
    try:
      lowered = _export.lowered_export(self._program_torch, self.specs, name, decompose)
      self._lowered[decompose] = lowered
      return _export.as_program(lowered, name, allow_writes=True, prefix="module.")
    except _export_errors.ExportError as err:
      raise _refusal.Refusal("export", err.summary, err.detail) from err
    except ValueError as err:  # the lowering's own checks (dynamic dimensions)
      raise _refusal.Refusal("export", str(err)) from err

  def from_disk(self, runner: str) -> _export.Program | None:
    """`runner`'s capture of this signature kept on disk by an earlier
    process (`_disk.py`), or None.

    Raises:
      Refusal: the refusal it met there.
    """
    key = self._disk_key
    found = None if key is None else _disk.load(key, runner)
    if found is None:
      return None
    self._read_from_disk.add(runner)
    program_torch, facts = found
    if program_torch is None:
      raise _disk.refusal_of(facts)
    self.batch = facts["batch"]
    return _export.as_program(program_torch, self._state.name, allow_writes=True, prefix="module.")

  def to_disk(self, runner: str, made: _refusal.Refusal | None, decompose: bool) -> None:
    """Keeps `runner`'s capture on disk (its lowering), or its refusal
    (`made`): of an op, the export or the check, not another error."""
    key = self._disk_key
    if key is None or runner in self._read_from_disk:
      return
    if made is None:
      lowered = self._lowered.get(decompose)
      if lowered is not None:
        _disk.keep(key, runner, lowered, {"batch": self.batch, "refusal": None})
    elif made.what in ("op", "export", "check"):
      _disk.keep(key, runner, None, _disk.refusal_facts(made))

  @functools.cached_property
  def _disk_key(self) -> str | None:
    if self._signature is None or _disk.directory() is None:
      return None
    return _disk.digest(self._state, self._signature)

  def close(self) -> None:
    """Drops the export (and the module tensors it holds)."""
    self._program_torch = None
    self._lowered.clear()


def _parameters(state: _torch_state.TorchState) -> int:
  return sum(state.variables[n].shape.num_elements() or 0 for n in state.param_names)


def _batch_size(specs: list[tf.TensorSpec]) -> int | None:
  """The leading size every argument shares (4 or more), or None."""
  leading = {s.shape.as_list()[0] if s.shape.rank else None for s in specs}
  if len(leading) != 1:
    return None
  (batch,) = leading
  return batch if batch is not None and batch >= 4 else None


def _batch_kept(program: torch.export.ExportedProgram, batch: int) -> bool:
  """Whether every user input's leading size stayed symbolic, with the
  call's batch and the check's in its range."""
  user = set(program.graph_signature.user_inputs)
  for node in program.graph.nodes:
    if node.op == "placeholder" and node.name in user:
      value = node.meta.get("val")
      if not isinstance(value, torch.Tensor):
        continue
      size = value.shape[0]
      if not isinstance(size, torch.SymInt):
        return False
      allowed = program.range_constraints.get(size.node.expr)
      if allowed is None or not all(
        allowed.lower <= b <= allowed.upper for b in (batch, SMALL_BATCH)
      ):
        return False
  return True


def batch_sizes(program: Any, batch: int | None) -> dict[Any, int]:
  """`{symbol: batch}` for the user inputs' leading sizes of a lowered
  `program` exported at a symbolic batch (`SharedExport.batch`)."""
  if batch is None:
    return {}
  sizes: dict[Any, int] = {}
  for node in program.graph.nodes:
    if node.op == "placeholder" and node.name in program.user_inputs:
      value = node.meta.get("val")
      if isinstance(value, torch.Tensor) and isinstance(value.shape[0], torch.SymInt):
        sizes[value.shape[0].node.expr] = batch
  return sizes


def dims_at(shape: Any, sizes: Mapping[Any, int]) -> list[int | None]:
  """A torch shape's dimensions, its symbolic ones at `sizes` (`{symbol:
  size}`) where that fixes them, else None."""
  return [
    d
    if isinstance(d, int)
    else _known(d.node.expr.subs(sizes))
    if isinstance(d, torch.SymInt)
    else int(d)
    for d in shape
  ]


def _known(expr: Any) -> int | None:
  return int(expr) if expr.is_number else None
