"""A bridged training step, phase by phase: `tb.timeline()` and the profilers.

One step (a TorchModule forward and backward inside a `tf.function`, a Keras
optimizer step) is recorded on both paths (the native op, and
`tf.py_function`, forced while tracing with `_loader.python_path()`), and
every phase the README lists must be in the recording, in TF's profiler and
in torch's; off, the spans are the shared no-op.
"""

import glob
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from torchbridge._native import _loader
from torchbridge._runtime import _timeline

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge

NATIVE = _loader.available()
PYTHON_PHASES = {
  _timeline.CALL,
  _timeline.BIND,
  _timeline.FORWARD,
  _timeline.BACKWARD,
  _timeline.CHECK,
  _timeline.SAVE,
}
PY_FUNCTION_PHASES = {_timeline.HAND_OFF, _timeline.TO_TORCH, _timeline.TO_TF}
KERNEL_PHASES = {
  "torchbridge/kernel",
  "torchbridge/wait for torch thread",
  "torchbridge/torch thread",
  "torchbridge/wrap inputs",
  "torchbridge/acquire GIL",
  "torchbridge/callback (GIL held)",
  "torchbridge/adopt outputs",
}


def _expected(path):
  if path == "native":
    return PYTHON_PHASES | KERNEL_PHASES
  return PYTHON_PHASES | PY_FUNCTION_PHASES


def _training_step(path):
  """A traced training step on `path` ("native" or "py_function")."""
  torch.manual_seed(0)
  module = tb.TorchModule(
    torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)), name="net"
  )
  opt = tf.keras.optimizers.Adam(1e-3)

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(module(x) ** 2)
    grads = tape.gradient(loss, module.trainable_variables)
    opt.apply_gradients(zip(grads, module.trainable_variables))
    return loss

  x = tf.ones([4, 3])
  if path == "py_function":
    with _loader.python_path():
      step.get_concrete_function(x)
  step(x)  # traced, optimizer slots made: the recorded step is a steady one
  return lambda: step(x)


PATHS = [
  pytest.param(
    "native", marks=pytest.mark.skipif(not NATIVE, reason="the native op is not available")
  ),
  "py_function",
]


@pytest.mark.parametrize("path", PATHS)
def test_a_recorded_step_holds_every_phase(path, tmp_path):
  step = _training_step(path)
  with tb.timeline() as trace:
    step()
  names = {e["name"] for e in trace.events}
  assert _expected(path) <= names, sorted(_expected(path) - names)
  if path == "py_function":
    assert not names & KERNEL_PHASES
  # One forward and one backward bridged call: two python calls.
  totals = trace.totals_us()
  assert totals[_timeline.CALL][0] == 2
  assert totals[_timeline.FORWARD][0] == 1
  assert totals[_timeline.BACKWARD][0] == 1
  for event in trace.events:
    assert event["end_ns"] >= event["begin_ns"] > 0

  # Spans nest in time: each torch forward lies inside a python call on the
  # same thread, and (native) each python call inside a callback.
  def inside(inner, outer_name):
    return any(
      o["name"] == outer_name
      and o["thread"] == inner["thread"]
      and o["begin_ns"] <= inner["begin_ns"] <= inner["end_ns"] <= o["end_ns"]
      for o in trace.events
    )

  for event in trace.events:
    if event["name"] == _timeline.FORWARD:
      assert inside(event, _timeline.CALL)
    if path == "native" and event["name"] == _timeline.CALL:
      assert inside(event, "torchbridge/callback (GIL held)")
      assert inside(event, "torchbridge/torch thread")
  # The Chrome / Perfetto export.
  trace.save(tmp_path / "step.json")
  exported = json.loads((tmp_path / "step.json").read_text())
  assert {e["name"] for e in exported["traceEvents"]} == names
  assert all(e["ph"] == "X" and e["dur"] >= 0 for e in exported["traceEvents"])


def test_recording_without_annotations_records_the_same_phases():
  step = _training_step("native" if NATIVE else "py_function")
  with tb.timeline(annotate=False) as trace:
    with torch.profiler.profile() as prof:
      step()
  assert PYTHON_PHASES <= {e["name"] for e in trace.events}
  assert not {e.name for e in prof.events()} & PYTHON_PHASES


def test_eager_calls_are_recorded_too():
  module = tb.TorchModule(torch.nn.Linear(3, 1), name="eager_net")
  x = tf.ones([2, 3])
  with tb.timeline() as trace:
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(module(x))
    tape.gradient(loss, module.trainable_variables)
  names = {e["name"] for e in trace.events}
  assert {_timeline.CALL, _timeline.FORWARD, _timeline.BACKWARD} <= names
  assert not names & KERNEL_PHASES  # eager calls do not go through the op


@pytest.mark.parametrize("path", PATHS)
def test_tf_profiler_shows_every_phase(path, tmp_path):
  step = _training_step(path)
  with tb.timeline():
    tf.profiler.experimental.start(str(tmp_path))
    try:
      step()
    finally:
      tf.profiler.experimental.stop()
  data = b""
  for path_pb in glob.glob(str(tmp_path / "**" / "*.xplane.pb"), recursive=True):
    with open(path_pb, "rb") as f:
      data += f.read()
  found = {m.decode() for m in re.findall(rb"torchbridge/[A-Za-z ()]+", data)}
  assert _expected(path) <= found, sorted(_expected(path) - found)


@pytest.mark.parametrize("path", PATHS)
def test_torch_profiler_shows_the_python_phases(path):
  step = _training_step(path)
  # The torch thread is not the profiling thread: torch's profiler sees it
  # with profile_all_threads (README, "A timeline of every call").
  config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)  # pylint: disable=protected-access
  with tb.timeline():
    with torch.profiler.profile(experimental_config=config) as prof:
      step()
  found = {e.name for e in prof.events()}
  wanted = PYTHON_PHASES | (PY_FUNCTION_PHASES if path == "py_function" else set())
  assert wanted <= found, sorted(wanted - found)


def test_off_a_span_is_the_shared_no_op_and_nothing_is_kept():
  assert _timeline._mode is None  # pylint: disable=protected-access
  assert _timeline.span(_timeline.FORWARD) is _timeline._OFF  # pylint: disable=protected-access
  # The per-call path skips its spans on this flag; it follows the recording.
  assert not _timeline.on
  step = _training_step("native" if NATIVE else "py_function")
  with tb.timeline() as trace:
    assert _timeline.on
  assert not _timeline.on
  step()  # after the recording: nothing more arrives
  assert trace.events == []
  with tb.timeline() as later:
    pass
  assert later.events == []  # the kernel kept nothing while off


def test_recordings_do_not_nest():
  with tb.timeline():
    with pytest.raises(RuntimeError, match="already running"):
      with tb.timeline():
        pass
  with tb.timeline() as again:  # the failed attempt left nothing behind
    pass
  assert again.events == []


def test_environment_variable_annotates_the_whole_process(tmp_path):
  code = textwrap.dedent("""
      import torch, tensorflow as tf, torchbridge as tb
      from torchbridge._runtime import _timeline
      f = tf.function(tb.torch_function(lambda x: x + 1))
      config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
      with torch.profiler.profile(experimental_config=config) as prof:
        f(tf.ones([2]))
      print(_timeline.span(_timeline.FORWARD) is _timeline._OFF,
            "torchbridge/torch forward" in {e.name for e in prof.events()})
      """)
  env = dict(os.environ, **{_timeline.ENV: "1", "TF_CPP_MIN_LOG_LEVEL": "3"})
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split()[-2:] == ["False", "True"], out.stdout
