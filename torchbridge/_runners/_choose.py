"""Which runner a module's graph calls take, and the call itself.

`run="auto"` (the default) runs each graph call signature as the exact TF
translation of its capture (`_tf_runner.py`) where it holds; else torch,
from C++ (`_torch_runner.py`) where that holds, else on the Python path
(the bridge: `TorchState.call_bridged`), said once at INFO with the
reason. `run="tf"` raises instead of taking torch; `run="torch"` never
translates. Eager calls always run torch on the Python path.

Both runners capture a signature from one `torch.export` (`SharedExport`,
held for this dispatch only), keep it with the Python state it read, and
hold the graph to that state (`_capture/_guard.py`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge import _call
from torchbridge._capture import _captures
from torchbridge._capture import _guard
from torchbridge._frameworks import _compat
from torchbridge._runners import _record
from torchbridge._state import _distribute
from torchbridge._state import _module_checks
from torchbridge._state import _torch_state
from torchbridge._translate import _refusal

if TYPE_CHECKING:  # imported on a first graph call: they bring torch.export (0.5 s)
  from torchbridge._capture import _shared_export
  from torchbridge._runners import _tf_runner
  from torchbridge._runners import _torch_runner

RUNS = ("auto", "tf", "torch")
_IN_REPLICA = "a graph call in a replica of a tf.distribute strategy with several replicas"


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


class Runners:
  """How one module's calls run: its runners and the choice between them.

  Args:
    state: the module's state.
    run: "auto", "tf" or "torch" (checked by `resolve_run`).
  """

  def __init__(self, state: _torch_state.TorchState, run: str) -> None:
    self.state = state
    self.run = run
    self._said: set[str] = set()
    self._specs_only = threading.local()  # .on: graph calls capture nothing

  @contextlib.contextmanager
  def specs_only(self) -> Iterator[None]:
    """Graph calls on this thread capture nothing and take the Python
    path: a graph only their output specs are read from (Keras' scratch
    graph while a functional model is built), never run."""
    self._specs_only.on = True
    try:
      yield
    finally:
      self._specs_only.on = False

  @functools.cached_property
  def tf_runner(self) -> _tf_runner.TFRunner | None:
    """The TF runner (None for run="torch")."""
    from torchbridge._runners import _tf_runner  # pylint: disable=import-outside-toplevel

    return _tf_runner.TFRunner(self.state) if self.run != "torch" else None

  @functools.cached_property
  def torch_runner(self) -> _torch_runner.TorchRunner:
    """The C++ torch runner."""
    from torchbridge._runners import _torch_runner  # pylint: disable=import-outside-toplevel

    return _torch_runner.TorchRunner(self.state)

  @tf.autograph.experimental.do_not_convert
  def call(
    self, args: Sequence[Any], kwargs: dict[str, Any], training: Any, output_signature: Any = None
  ) -> Any:
    """Runs the forward on TF tensors; see `TorchModule.__call__`.

    Reading buffers, the forward and writing them back are one step
    (eagerly under the module's lock, in a graph in a `tf.CriticalSection`
    when it may write one), except in a replica of several (the strategy
    aggregates the writes)."""
    state = self.state
    if _distribute.in_replica_of_several():
      return self._call(args, kwargs, training, output_signature)
    if tf.executing_eagerly():
      with state.lock:
        return self._call(args, kwargs, training, output_signature)
    # No CriticalSection under XLA: TF's launch holds the variables' locks.
    if state.may_write_buffers(training) and not _compat.in_xla_context():
      return state.exclusive.run(
        lambda after_writes: self._call(args, kwargs, training, output_signature, after_writes)
      )
    return self._call(args, kwargs, training, output_signature)

  def _call(
    self,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    training: Any,
    output_signature: Any,
    after_writes: list[Any] | None = None,
  ) -> Any:
    state = self.state
    if training is not None:
      training = _module_checks.as_python_bool(training, state.name)
    elif not tf.executing_eagerly():
      # A graph keeps the modes it was traced with (refused once they change).
      _guard.hold_to_modes(state.module, state.name, state.take_views_back)
      training = state.modes()
    call = _call.bind_arguments(state.name, (args, kwargs))
    _distribute.check_call_context(state.name, state.variables.values())
    mode_key = state.mode_key(training)
    if not tf.executing_eagerly() and not getattr(self._specs_only, "on", False):
      captured = self._captured_call(call, training, mode_key, output_signature)
      if captured is not None:
        result, writes = captured
        state.assign_writes(writes, mode_key, after_writes)
        return result
    return state.call_bridged(call, training, mode_key, output_signature, after_writes)

  def _captured_call(
    self, call: Any, training: bool | list[bool], mode_key: str, output_signature: Any
  ) -> tuple[Any, dict[str, tf.Tensor]] | None:
    """`(result, {buffer: new value})` of the graph call on a runner that
    captured it, or None: it takes the Python path."""
    state = self.state
    in_replica = _distribute.in_replica_of_several()
    from torchbridge._capture import _shared_export  # pylint: disable=import-outside-toplevel

    key = _captures.signature_key(call, training, mode_key)
    shared = _shared_export.SharedExport(state, call, key)
    try:
      why_torch = "run='torch'"
      if self.tf_runner is not None and in_replica:
        if self.run == "tf":
          raise ValueError(
            f'{state.name} (run="tf"): {_IN_REPLICA} runs torch on each replica\'s '
            'copies, never the translation; use run="auto" (or "torch") under such a strategy.'
          )
        why_torch = _IN_REPLICA
      elif self.tf_runner is not None:
        entry = self.tf_runner.entry(key, shared, training)
        if not isinstance(entry, _refusal.Refusal):
          translation, snapshot = entry
          self._say(
            "tf",
            f"torchbridge: {state.name}: graph calls run as TF ops (its exact translation, captured and "
            f"checked against torch in {translation.seconds:.2f} s)",
            capture_s=translation.seconds,
          )
          _guard.add_guard(snapshot, state.name, state.take_views_back)
          return self.tf_runner.run(translation, call.args_tf)
        if self.run == "tf":
          error = self.tf_runner.refusal_error(entry)
          _record.LOG.debug("%s\n%s", error, entry.detail)
          raise error
        why_torch = entry.said()
        self._say(
          "torch",
          f"torchbridge: {state.name}: graph calls run torch through the bridge "
          f"(run={self.run!r}): {why_torch}",
          why_torch,
          detail=entry.detail,
        )
      _call.check_not_xla(state.name)
      return self._torch(call, key, shared, training, output_signature, why_torch, in_replica)
    finally:
      shared.close()

  def _torch(
    self,
    call: Any,
    key: Any,
    shared: _shared_export.SharedExport,
    training: bool | list[bool],
    output_signature: Any,
    why_torch: str,
    in_replica: bool,
  ) -> tuple[Any, dict[str, tf.Tensor]] | None:
    """The call on the C++ torch runner, or None (said once, with why)."""
    runner = self.torch_runner
    why_not = runner.why_not(call.args_tf, in_replica)
    if why_not is not None:
      self._say_python(why_torch, *why_not)
      return None
    entry = runner.entry(key, shared, training)
    if isinstance(entry, _refusal.Refusal):
      self._say_python(why_torch, entry.said(), detail=entry.detail)
      return None
    program, snapshot = entry
    if output_signature is not None:
      mismatch = program.mismatch(output_signature)
      if mismatch:
        self._say_python(why_torch, mismatch)
        return None
    state = self.state
    _record.record(state, state.name, "torch", why_torch, program.seconds, path="C++")
    if self.tf_runner is None:  # run="auto" said why it takes torch already
      _record.say_once(
        self._said,
        logging.INFO,
        f"torchbridge: {state.name}: graph calls run torch from C++ (the C++ torch runner: "
        f"a torch.export capture per signature, no Python per call; {why_torch}).",
      )
    _guard.add_guard(snapshot, state.name, state.take_views_back)
    return runner.run(program, call.args_tf)

  def _say(
    self,
    runner: str,
    message: str,
    reason: str = "",
    capture_s: float | None = None,
    detail: str = "",
  ) -> None:
    _record.record(self.state, self.state.name, runner, reason, capture_s, detail=detail)
    _record.say_once(self._said, logging.INFO, message, detail)

  def _say_python(
    self, why_torch: str, reason: str, level: int = logging.WARNING, detail: str = ""
  ) -> None:
    name = self.state.name
    _record.record(
      self.state, name, "torch", why_torch, path="Python", path_reason=reason, detail=detail
    )
    _record.say_once(
      self._said,
      level,
      f"torchbridge: {name}: graph calls run torch on the Python path (the forward's "
      f"Python on every call), not the C++ runner: {_record.one_line(reason).rstrip('.')}.",
      detail,
    )
