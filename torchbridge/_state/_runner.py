"""Which runner a module's graph calls take: its TF translation or torch.

`run="auto"` (the default) captures each graph call signature once
(`torch.export`, `_translate/_capture.py`), checks the translation against
torch, and runs it as TF ops; where the translation is missing an op or
fails its check, the call runs torch through the bridge, said once at INFO.
`run="tf"` raises instead; `run="torch"` never captures. Eager calls always
run torch.

A capture is keyed on the call's signature (shapes, dtypes, the non-tensor
arguments and the torch modes) and bakes in the module's plain Python
attributes (`_watch.py`): a later trace re-captures if one changed, and a
graph traced before the change refuses to run, naming it (a check made in
Python on every call of the user's `tf.function`).
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._frameworks import _compat
from torchbridge._runtime import _runners
from torchbridge._state import _capturing
from torchbridge._state import _distribute
from torchbridge._state import _watch

logger = logging.getLogger("torchbridge")

RUNS = ("auto", "tf", "torch")
TORCH = object()  # `Runner.call`'s answer: this call runs torch

_STALE = """\
{name}: {change}.
A graph traced before that change runs this module from a capture (its TF
translation, or torch from C++) with the old value baked in, so it refuses
to run rather than compute with a stale value. Trace again to capture the
new value (a new tf.function, or new input shapes); for a value that
changes during training, pass it as a tensor argument or keep it in a
buffer (register_buffer), which graph calls read at run time; or set
TORCHBRIDGE_TORCH_RUNNER=python and construct the module with run="torch",
which runs the forward's Python on every call."""


class StaleCaptureError(RuntimeError):
  """`tb.StaleCaptureError`: a Python attribute a captured forward read changed since."""


def check_run(run: Any, owner: str) -> str:
  """`run=` as given, or a ValueError naming the choices."""
  if not isinstance(run, str) or run not in RUNS:
    raise ValueError(
      f'{owner}(run=...) takes "auto", "tf" or "torch", got {run!r}: "auto" '
      'runs graph calls as the exact TF translation where it holds, "tf" '
      'always (or raises), "torch" through the bridge.'
    )
  return run


def resolve_run(run: Any, torchscript: bool, owner: str) -> str:
  """The runner of a wrapper given `run=` and `torchscript=`: the C++ trace
  of `torchscript=True` is a torch runner, so it implies "torch"."""
  run = check_run(run, owner)
  if torchscript and run == "tf":
    raise ValueError(
      f'{owner}(torchscript=True, run="tf") asks for two runners: '
      'torchscript=True runs torch from C++; run="tf" runs the TF '
      "translation. Leave one out."
    )
  return "torch" if torchscript else run


class Runner:
  """The captures of one module, by signature."""

  def __init__(self, state: Any, run: str) -> None:
    self._state = state
    self.run = run
    self._captures: dict[Any, Any] = {}  # key -> (Capture, Snapshot) or Refusal
    self._said: set[str] = set()
    self._lock = threading.Lock()

  def call(
    self,
    call: Any,
    training: bool | list[bool],
    mode_key: str,
    mutated_buffers: dict[str, frozenset[str]],
    after_writes: list[Any] | None,
  ) -> Any:
    """The call's result as TF ops in the graph being traced, the buffers
    it writes assigned to their variables (noted in `mutated_buffers`,
    their new values appended to `after_writes`); or `TORCH` when it takes
    torch (said once)."""
    if _distribute.in_replica_of_several():
      # Neither runner serves a replica of several: the Python path does.
      if self.run == "tf":
        raise ValueError(
          f'{self._state.name} (run="tf"): a graph call in a replica of a '
          "tf.distribute strategy with several replicas runs torch on each "
          'replica\'s copies, never the translation; use run="auto" (or '
          '"torch") under such a strategy.'
        )
      return TORCH
    from torchbridge._translate import _capture  # torch.export: on first use

    key = _capturing.signature_key(call, training, mode_key)
    entry = _capturing.cached_capture(self._captures, key, self._capture, call, training, _capture)
    if isinstance(entry, _capture.Refusal):
      if self.run == "tf":
        raise _refusal_error(entry, self._state.name)
      self._say(
        "torch",
        f"{self._state.name}: graph calls run torch through the bridge "
        f"(run={self.run!r}): {_WHAT[entry.what]}: {entry.reason}",
        entry.reason,
      )
      return TORCH
    captured, snapshot = entry
    self._say(
      "tf",
      f"{self._state.name}: graph calls run as TF ops (its exact translation, "
      f"captured and checked against torch in {captured.seconds:.2f} s)",
      "",
      captured.seconds,
    )
    add_guard(snapshot, self._state.name, self._state.take_views_back)
    result, writes = captured.run(call.args_tf)
    _capturing.assign_writes(self._state, writes, mutated_buffers, mode_key, after_writes)
    return result

  def _capture(self, call: Any, training: bool | list[bool], capture_module: Any) -> Any:
    state = self._state
    specs = [tf.TensorSpec(a.shape, a.dtype) for a in call.args_tf]
    with _capturing.Capturing(state, training) as held:
      try:
        captured = capture_module.capture(
          state.module,
          call.substitute,
          specs,
          {n: _plain_variable(v) for n, v in state.variables.items()},
          # state_dict names, and the names of non-persistent buffers
          # (not in the state_dict: Hugging Face's position ids).
          {**{n: n for n in state.variables}, **state.state_names},
          state.name,
        )
        changed = held.changed()
        if changed is not None:
          return capture_module.Refusal("check", changed)
      except capture_module.Refusal as refusal:
        return refusal
      except Exception as err:  # pylint: disable=broad-except
        # Anything else in capturing (TF's own gradient code included) is
        # a limit of the translation: this call takes torch.
        return capture_module.Refusal("translation", f"{type(err).__name__}: {err}")
    return captured, held.after

  def _say(self, runner: str, message: str, reason: str, seconds: float | None = None) -> None:
    _runners.record(self._state.name, runner, reason, seconds)
    if message not in self._said:
      self._said.add(message)
      logger.info(message)


_WHAT = {
  "op": "an op has no TF translation",
  "export": "torch.export could not capture the forward",
  "check": "the translation failed its check against torch",
  "translation": "an op's translation raised",
}


def _refusal_error(refusal: Any, name: str) -> Exception:
  from torchbridge._translate import _translated

  message = (
    f'{name} (run="tf"): its graph calls cannot run as TF ops: '
    f'{_WHAT[refusal.what]}: {refusal.reason}\nrun="auto" runs them in '
    'torch through the bridge instead (run="torch" always does).'
  )
  if refusal.what == "op":
    return _in_graph(_translated.UntranslatedOpsError)(message)
  if refusal.what == "check":
    return _translated.ParityError(message)
  return ValueError(message)


@functools.cache
def _in_graph(error_type: type[Exception]) -> type[Exception]:
  """`error_type` with Exception's own __init__: AutoGraph re-raises such
  an error from a `tf.function` as itself, not as a StagingError."""
  return type(error_type.__name__, (error_type,), {"__init__": Exception.__init__})


def _plain_variable(variable: Any) -> tf.Variable:
  # keras.Variable (TorchLayer) holds a tf.Variable: the translation reads that.
  return variable if isinstance(variable, tf.Variable) else variable.value


_ZERO: list[tf.Tensor] = []


# graph -> {id(snapshot): (snapshot, module name, before_call)}: the
# captures its one check covers.
_CHECKS: weakref.WeakKeyDictionary[Any, dict[int, tuple[Any, str, Any]]] = (
  weakref.WeakKeyDictionary()
)


class CheckType(tf.types.experimental.TraceType):
  """The check's call-time capture's type: an int32 scalar whose TraceType
  methods do nothing they need not.

  TF runs a call-time capture's type on every call of the function (its
  `cast` and `to_tensors`, and its hash and comparisons in the lookup of
  the traced function): a `tf.TensorSpec`'s are Python that validates the
  value, 84 of the 217 Python calls the capture adds to a call (counted
  by cProfile; in wall time within this machine's noise,
  benchmarks/guard_cost.py). The check always returns the same eager
  int32 scalar (`_ZERO`), so there is nothing to validate."""

  _SPEC = tf.TensorSpec([], tf.int32)

  def is_subtype_of(self, other: Any) -> bool:
    return isinstance(other, CheckType)

  def most_specific_common_supertype(self, others: Any) -> Any:
    return self if all(isinstance(o, CheckType) for o in others) else None

  def placeholder_value(self, placeholder_context: Any) -> Any:
    return self._SPEC.placeholder_value(placeholder_context)

  def to_tensors(self, value: Any) -> list[Any]:
    return [value]

  def from_tensors(self, tensors: Any) -> Any:
    return next(tensors)

  def flatten(self) -> list[Any]:
    return [self._SPEC]

  def cast(self, value: Any, casting_context: Any) -> Any:
    return value

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, CheckType)

  def __hash__(self) -> int:
    return hash(CheckType)

  def __repr__(self) -> str:
    return "torchbridge check (int32 scalar)"


def check(entries: Iterable[tuple[_watch.Snapshot, str, Any]]) -> None:
  """What `add_guard`'s check runs before each call of a graph, for the
  graph's `(snapshot, module name, before_call)` entries: each module's
  views taken back, then a `StaleCaptureError` naming the first change."""
  for watched, module_name, before in entries:
    before()
    change = watched.first_change()
    if change is not None:
      raise StaleCaptureError(_STALE.format(name=module_name, change=change))


def add_guard(snapshot: _watch.Snapshot, name: str, before_call: Any) -> None:
  """Makes every call of the graph being traced check, in Python, that the
  state the capture read is unchanged (a call-time capture of TF's: run
  before each call of the outermost `tf.function`, XLA's included), and
  run `before_call()` (taking the torch module's views back, as a bridged
  call does). One such capture per graph checks all its captures."""
  if _compat.in_saved_model_trace():
    return  # a SavedModel runs without the Python objects
  if not _ZERO:
    with tf.init_scope():
      _ZERO.append(tf.constant(0))
  graph = _compat.function_graph()
  checks = _CHECKS.get(graph)
  if checks is None:
    checks = _CHECKS[graph] = {}
    entries = checks.values()

    def guard() -> tf.Tensor:
      check(entries)
      return _ZERO[0]

    with graph.as_default():
      # default_value: what `tf.saved_model.save` feeds a function traced
      # before it (a SavedModel runs without the Python objects).
      graph.capture_call_time_value(
        guard, CheckType(), key="torchbridge check", default_value=_ZERO[0]
      )
  checks[id(snapshot)] = (snapshot, name, before_call)
