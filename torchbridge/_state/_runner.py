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
graph traced before the change refuses to run, naming it (`_guard.py`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._runtime import _runners
from torchbridge._state import _capturing
from torchbridge._state import _distribute
from torchbridge._state import _guard

logger = logging.getLogger("torchbridge")

RUNS = ("auto", "tf", "torch")
TORCH = object()  # `Runner.call`'s answer: this call runs torch


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
      if entry.export_refused:  # the C++ runner's export would refuse the same
        self._state.torch_runner.export_refused(key, entry.reason, entry.detail)
      if self.run == "tf":
        raise _refusal_error(entry, self._state.name)
      reason = f"{_WHAT[entry.what]}: {entry.reason}"
      self._say(
        "torch",
        f"{self._state.name}: graph calls run torch through the bridge "
        f"(run={self.run!r}): {reason}",
        reason,
        detail=entry.detail,
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
    _guard.add_guard(snapshot, self._state.name, self._state.take_views_back)
    with _name_scope(self._state.name):  # as a Keras layer's ops are named
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
        return capture_module.Refusal(
          "translation", f"{type(err).__name__}: {err}", f"{type(err).__name__}: {err}"
        )
    return captured, held.after

  def _say(
    self, runner: str, message: str, reason: str, seconds: float | None = None, detail: str = ""
  ) -> None:
    _runners.record(self._state.name, runner, reason, seconds, detail=detail)
    _runners.say_once(self._said, logging.INFO, message, detail)


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
  if refusal.detail:
    logger.debug("%s\n%s", message, refusal.detail)
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


def _name_scope(name: str) -> Any:
  """The module's name scope for its translated ops (`actor/MatMul`), so
  TF's profiler and TensorBoard's graph name the module; none where the
  caller's scope ends with that name already (Keras opens a layer's)."""
  scope = tf.compat.v1.get_default_graph().get_name_scope()
  if re.fullmatch(re.escape(name) + r"(_\d+)?", scope.rsplit("/", 1)[-1]):
    return contextlib.nullcontext()
  return tf.name_scope(name)


def _plain_variable(variable: Any) -> tf.Variable:
  # keras.Variable (TorchLayer) holds a tf.Variable: the translation reads that.
  return variable if isinstance(variable, tf.Variable) else variable.value
