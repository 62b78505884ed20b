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

import concurrent.futures
import functools
import logging
import threading
import weakref
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._frameworks import _compat
from torchbridge._runtime import _omp_team
from torchbridge._runtime import _runners
from torchbridge._state import _module_checks
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
  """A Python attribute a captured forward read has changed since."""


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
    from torchbridge._translate import _capture  # torch.export: on first use

    key = signature_key(call, training, mode_key)
    entry = cached_capture(self._captures, key, self._capture, call, training, _capture)
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
    assign_writes(self._state, writes, mutated_buffers, mode_key, after_writes)
    return result

  def _capture(self, call: Any, training: bool | list[bool], capture_module: Any) -> Any:
    state = self._state
    specs = [tf.TensorSpec(a.shape, a.dtype) for a in call.args_tf]
    with Capturing(state, training) as held:
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


def assign_writes(
  state: Any,
  writes: dict[str, tf.Tensor],
  mutated_buffers: dict[str, frozenset[str]],
  mode_key: str,
  after_writes: list[Any] | None,
) -> None:
  """Assigns the buffers a captured call wrote to their variables, as the
  Python path does: noted in `mutated_buffers` for the mode, their new
  values appended to `after_writes` (the call's critical section)."""
  mutated_buffers[mode_key] = frozenset(writes)
  for name, value_tf in writes.items():
    variable = state.variables[name]
    variable.assign(value_tf)
    if after_writes is not None:
      after_writes.append(tf.convert_to_tensor(variable))


def signature_key(call: Any, training: bool | list[bool], mode_key: str) -> tuple[Any, ...]:
  """A capture's key: the torch modes, the arguments' shapes and dtypes,
  and the non-tensor arguments."""
  return (
    mode_key,
    isinstance(training, list),
    tuple((tuple(a.shape.as_list()), a.dtype.name) for a in call.args_tf),
    call.static_key(),
  )


def cached_capture(captures: dict[Any, Any], key: Any, capture: Any, *args: Any) -> Any:
  """`captures[key]`, or (none yet, or the Python state it read has
  changed since) `capture(*args)` made now and kept there. A capture runs
  on a thread of its own: eager, and with a tape stack of its own (a
  function being traced stops the tracing thread's tapes, which the
  check's gradients need). That thread's OpenMP team (the check ran torch
  there) is released before it ends: left behind, its idle workers made
  every later parallel region of the torch thread pay a futex wake-up
  (the C++ torch runner's TD3 step: 9.1 ms, 7.2 ms with it released;
  `_runtime/_omp_team.py`)."""
  entry = captures.get(key)
  if isinstance(entry, tuple) and entry[1].first_change() is not None:
    entry = None  # Python state it read changed: capture again
  if entry is None:

    def on_own_thread() -> Any:
      try:
        return capture(*args)
      finally:
        _omp_team.release_this_threads_team()

    with concurrent.futures.ThreadPoolExecutor(1, "torchbridge-capture") as pool:
      entry = pool.submit(on_own_thread).result()
    captures[key] = entry
  return entry


class Capturing:
  """The module ready to be captured, as a graph call would run it: under
  its state's lock, its tensors viewing the variables' values,
  torchbridge's own hooks suspended, the call's modes set. `changed()`
  says (as a refusal's reason) what Python state the forward changed
  since it was entered, a counter of its own calls say, which no capture
  holds one value of; after it is left, `after` is what a capture read."""

  def __init__(self, state: Any, training: bool | list[bool]) -> None:
    self._state = state
    self._training = training
    self.after: _watch.Snapshot | None = None

  def _snapshot(self) -> _watch.Snapshot:
    state = self._state
    return _watch.Snapshot(
      list(state.module.named_modules()),
      watch_mode=False,
      ignored=frozenset(state._views.hook_ids()),  # pylint: disable=protected-access
    )

  def __enter__(self) -> Capturing:
    state = self._state
    state._lock.acquire()  # pylint: disable=protected-access
    try:
      views = state._views  # pylint: disable=protected-access
      views.lend()
      views.suspend_hooks()
      self._saved = _module_checks.set_modes(state.module, state._modules, self._training)  # pylint: disable=protected-access
      self._before = self._snapshot()
    except BaseException:
      state._lock.release()  # pylint: disable=protected-access
      raise
    return self

  def changed(self) -> str | None:
    change = self._before.first_change()
    if change is None:
      return None
    return (
      f"the forward changed its Python state while captured: {change}; a "
      "capture would keep one value"
    )

  def __exit__(self, *exc_info: Any) -> None:
    state = self._state
    try:
      if self._saved is not None:
        _module_checks.restore_modes(self._saved)
      state._views.resume_hooks()  # pylint: disable=protected-access
      self.after = self._snapshot()
    finally:
      state._lock.release()  # pylint: disable=protected-access


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
      for watched, module_name, before in entries:
        before()
        change = watched.first_change()
        if change is not None:
          raise StaleCaptureError(_STALE.format(name=module_name, change=change))
      return _ZERO[0]

    with graph.as_default():
      # default_value: what `tf.saved_model.save` feeds a function traced
      # before it (a SavedModel runs without the Python objects).
      graph.capture_call_time_value(
        guard, tf.TensorSpec([], tf.int32), key="torchbridge check", default_value=_ZERO[0]
      )
  checks[id(snapshot)] = (snapshot, name, before_call)
