"""The torch-side state a bridged call keeps for its backward, and the backward.

A forward that a gradient may reach keeps a `Saved` record: its torch
outputs, the torch leaves that stand for its TF arguments, and torch's
autograd graph between them. The backward never re-runs the forward: it
computes a vector-Jacobian product on that graph (`backward`), itself as a
new `Saved` record, so gradients compose to any order. Inside `tf.function`
the record is owned by a one-byte handle tensor that TF holds as long as a
gradient may need it (`own`, `lookup`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import cast

import torch

from torchbridge._call import _vjp
from torchbridge._frameworks import _compat
from torchbridge._runtime import _timeline

# Handle data pointer -> (`Saved`, weak reference to the handle): the record
# lives as long as the handle's Python object, which TF keeps alive while it
# holds the handle (see `_own`).
_SAVED_BY_HANDLE: dict[int, tuple[Saved, weakref.ref[torch.Tensor]]] = {}


# Under XLA (jit_compile=True) outputs are copied into XLA's buffers, so no
# TF tensor can hold the handle's torch object: the handle carries an id
# (int64) instead, and the record lives here until its backward takes it
# (`own_id`, `lookup`).
_SAVED_BY_ID: dict[int, list[Saved | int]] = {}  # id -> [record, backwards left]
_ids = itertools.count(1)


class Saved:
  """Torch-side state of one bridged call, kept for its backward."""

  __slots__ = ("outs_torch", "leaves_torch", "has_graph", "regraph", "__weakref__")

  def __init__(
    self,
    outs_torch: Sequence[torch.Tensor | None],
    leaves_torch: Sequence[torch.Tensor | None],
    has_graph: bool,
    regraph: Callable[[], Saved] | None = None,
  ) -> None:
    # Flat torch outputs, and for each TF argument of the call the torch leaf
    # that stands for it (None where the argument gets no gradient).
    self.outs_torch = outs_torch
    self.leaves_torch = leaves_torch
    self.has_graph = has_graph
    # Recomputes this record with an autograd graph, for the rare case (a
    # second-order gradient inside tf.function) where it was made without.
    self.regraph = regraph


def backward(
  saved: Saved,
  sel_out: Sequence[int],
  diff_args: Sequence[int],
  dys_torch: list[torch.Tensor],
  record: bool,
  skip: Collection[int] = (),
  none_ok: bool = False,
) -> Saved:
  """The vector-Jacobian product of a saved call, as a new `Saved`.

  `dys_torch` are torch views of the upstream gradients of the outputs
  `sel_out`; the result holds the gradients of the arguments `diff_args`,
  None at the positions `skip` (gradients nothing consumes).
  """
  if not saved.has_graph:
    assert saved.regraph is not None  # a record made without a graph can remake itself
    saved = saved.regraph()
  if record:
    dys_torch = [dy.requires_grad_() for dy in dys_torch]
  # The leaves of the arguments that get gradients: never None. (Loops
  # rather than comprehensions: each is a frame on the per-call path.)
  leaves = cast("list[torch.Tensor]", [saved.leaves_torch[j] for j in diff_args])
  # Leaves that do not require grad: arguments torch refused to
  # differentiate (see `_call_bridged.call_bridged`).
  refused, wanted, leaves_wanted = [], [], []
  for k, leaf in enumerate(leaves):
    if k in skip:
      continue
    if leaf.requires_grad:
      wanted.append(k)
      leaves_wanted.append(leaf)
    else:
      refused.append(k)
  # Outputs torch computed without a graph (detached, integer-valued paths)
  # contribute nothing, nor do outputs a backward left out (None).
  outs, dys = [], []
  for i, dy in zip(sel_out, dys_torch):
    out = saved.outs_torch[i]
    if out is not None and out.requires_grad:
      outs.append(out)
      dys.append(dy)
  grads_torch: list[torch.Tensor | None] = [None] * len(leaves)
  grad_mode = torch.is_grad_enabled()
  _compat.set_grad_enabled(True)
  phase = _timeline.span(_timeline.BACKWARD) if _timeline.on else None
  try:
    if outs and wanted:
      grads_wanted = _vjp_or_none(outs, dys, leaves_wanted, record, none_ok)
    else:
      grads_wanted = [torch.zeros_like(leaf) for leaf in leaves_wanted]
  finally:
    if phase is not None:
      phase.stop()
    _compat.set_grad_enabled(grad_mode)
  for k, grad in zip(wanted, grads_wanted):
    grads_torch[k] = grad
  for k in refused:
    grads_torch[k] = None if none_ok else torch.zeros_like(leaves[k])
  # Made without a graph, the record can make itself again with one (and
  # every gradient), should a second-order gradient ask for it.
  regraph = (
    None
    if record
    else functools.partial(backward, saved, sel_out, diff_args, dys_torch, True, none_ok=none_ok)
  )
  return Saved(grads_torch, dys_torch + leaves, has_graph=record, regraph=regraph)


def _vjp_or_none(
  outs: Sequence[torch.Tensor],
  dys: Sequence[torch.Tensor],
  leaves: Sequence[torch.Tensor],
  record: bool,
  none_ok: bool,
) -> Sequence[torch.Tensor | None]:
  """The vector-Jacobian product for `leaves`; for a leaf that torch
  declares non-differentiable (a loss's target), None (`none_ok`: eagerly,
  where TF takes a None gradient) or zeros (a graph's op cannot leave out
  an output it declared), instead of failing."""
  try:
    return _vjp.vjp(outs, leaves, dys, create_graph=record)
  except RuntimeError as err:
    if not _is_not_differentiable(err):
      raise
  grads: list[torch.Tensor | None] = []
  for leaf in leaves:
    try:
      grads.append(_vjp.vjp(outs, [leaf], dys, create_graph=record)[0])
    except RuntimeError as err:
      if not _is_not_differentiable(err):
        raise
      grads.append(None if none_ok else torch.zeros_like(leaf))
  return grads


def _is_not_differentiable(err: BaseException) -> bool:
  text = str(err)
  return "is not differentiable with respect to" in text or (
    "derivative for" in text and "is not implemented" in text
  )


def own(handle_torch: torch.Tensor, saved: Saved) -> None:
  """Makes `handle_torch` own `saved`.

  TF holds the handle's torch tensor whole (the native op's
  whole_tensor_outputs; torch's DLPack export on the tf.py_function path),
  and torch keeps its Python object alive as long as TF does; when that
  object dies, the weak reference's callback drops the record.
  """
  key = handle_torch.data_ptr()

  def forget(ref: weakref.ref[torch.Tensor]) -> None:
    # Only this handle's own entry (a later handle may reuse the address).
    if _SAVED_BY_HANDLE.get(key, (None, None))[1] is ref:
      _SAVED_BY_HANDLE.pop(key, None)

  _SAVED_BY_HANDLE[key] = (saved, weakref.ref(handle_torch, forget))


def own_id(saved: Saved, backwards: int = 1) -> torch.Tensor:
  """A handle for a call under XLA: an int64 id of `saved`, kept until
  `backwards` backward calls took it (`lookup`): as many as TF traced for
  this call before it ran (a persistent tape asked twice traces two; a call
  with none traced keeps no record, `_graph.call_graph`). Traces are not
  runs: a record whose traced backwards do not all run stays (an eager tape
  around the compiled function that records the call and is never asked;
  nested or persistent eager tapes around it, for which TF traces more
  backward functions than it runs). Nothing TF gives frees it then: no TF
  tensor can own it inside XLA. A warning says so at 1,000 records waiting
  and at each tenfold (`MANY_WAITING`)."""
  key = next(_ids)
  _SAVED_BY_ID[key] = [saved, max(1, backwards)]
  waiting = len(_SAVED_BY_ID)
  if _is_mark(waiting):
    _LOG.warning(MANY_WAITING, waiting)
  return torch.tensor([key], dtype=torch.int64)


def _is_mark(waiting: int) -> bool:
  """Whether `waiting` is 1,000, 10,000, ...: where the warning is said
  (as `WarnIfMany` in csrc/exported/exported_call.cc decides it)."""
  mark = _MANY
  while mark < waiting:
    mark *= 10
  return mark == waiting


# Records waiting under XLA at which (and at each tenfold) a warning says
# why; csrc/exported/exported_call.cc says the same for the C++ runner.
_MANY = 1000
_LOG = logging.getLogger("torchbridge")
MANY_WAITING = (
  "torchbridge: %d records of torch calls compiled with XLA (jit_compile=True) "
  "are waiting for gradients that have not run. A tf.GradientTape outside "
  "the compiled function records each call, and one that is never asked (or "
  "a persistent one asked fewer times than TF traced its gradient) keeps "
  "that torch state for the life of the process. Open the GradientTape "
  "inside the jit-compiled function, or call it outside any tape (or under "
  "tape.stop_recording())."
)


def lookup(handle_torch: torch.Tensor) -> Saved:
  if handle_torch.dtype == torch.int64:  # a handle made under XLA
    key = int(handle_torch[0])
    entry = _SAVED_BY_ID.get(key)
    if entry is not None:
      entry[1] = cast("int", entry[1]) - 1
      if not entry[1]:
        _SAVED_BY_ID.pop(key, None)
    if entry is None:
      raise RuntimeError(
        "torchbridge: no saved torch state for this gradient of a call "
        "compiled with XLA (jit_compile=True)"
        + (
          ": no gradient of the call was traced before it ran (no tape was "
          "recording it when the tf.function was traced). Open the "
          "GradientTape inside the jit-compiled function."
          if key == 0
          else ": its backwards already ran (under XLA each forward's state "
          "serves the backwards traced with it, once each)."
        )
      )
    return cast("Saved", entry[0])
  saved, _ = _SAVED_BY_HANDLE.get(handle_torch.data_ptr(), (None, None))
  if saved is None:
    raise RuntimeError(
      "torchbridge lost the saved torch state of a forward call before its "
      "backward ran (the handle tensor was copied or freed early). This is "
      "a bug in torchbridge; please report it with the code that "
      "triggered it."
    )
  return saved
