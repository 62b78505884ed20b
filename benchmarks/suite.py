"""The measurements: exchange, per-call overhead, training steps, TD3, memory.

The exchange and per-call overhead compare TF-side calls and run in this
process; every training step runs in processes of its own.
"""

import itertools
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf
import torch  # noqa: F401  (before TensorFlow)
import torch.utils.dlpack as torch_dlpack

import torchbridge as tb
from torchbridge._native import _loader
from torchbridge._native import _op
from benchmarks import harness
from benchmarks import numpy_bridge
from benchmarks import report
from benchmarks import scripted_native
from benchmarks import train_step

# Bridged calls per TD3 train step: the target actor's and target critic's
# forwards, the critic's forward and backward; every other step also the
# actor update's actor and critic forwards and backwards: 6 on average.
FLOOR_TD3 = "floor: TD3 TF function + Keras Adam + bare native ops (6 per step on average)"
# The torchbridge backend with its graph calls handed to the torch thread
# (the library's default; the example runs them on TF's thread).
TD3_TORCH_THREAD = "torchbridge, calls on the torch thread"
LEAN_TD3 = report.LEAN_TD3
SCRIPTED_TD3 = report.SCRIPTED_TD3
TORCH_RUNNER_TD3 = report.TORCH_RUNNER_TD3

EXCHANGE_SIZES = {"4KB": 4 << 10, "256KB": 256 << 10, "16MB": 16 << 20, "64MB": 64 << 20}


def exchange(quick, device):
  """Round trip TF -> torch -> TF: torchbridge against numpy copies."""
  sizes = ["4KB", "256KB", "16MB"] if quick else list(EXCHANGE_SIZES)
  results = {}
  for label in sizes:
    n_bytes = EXCHANGE_SIZES[label]
    with tf.device(_tf_device(device)):
      x_tf = tf.random.uniform([n_bytes // 4])
    tb.reset_exchange_stats()
    tb.to_tf(tb.to_torch(x_tf))
    tb_bytes = tb.exchange_stats()["bytes_copied"]
    numpy_calls = max(1, min(50, (32 << 20) // n_bytes))
    timings = harness.interleaved(
      # Timed here, within this iteration: x_tf is this size's tensor.
      {
        "torchbridge": lambda: tb.to_tf(tb.to_torch(x_tf)),  # noqa: B023
        "numpy_copy": lambda: numpy_bridge.exchange_round_trip(x_tf),  # noqa: B023
      },
      repeats=5 if quick else 9,
      calls={"torchbridge": 200, "numpy_copy": numpy_calls},
      warmup=3,
    )
    results[label] = {
      "bytes": n_bytes,
      "timings": timings,
      "bytes_copied": {
        "torchbridge": tb_bytes,
        "numpy_copy": numpy_bridge.bytes_copied_by_round_trip(x_tf),
      },
    }
  return results


def overhead(quick, device):
  """Per-call cost of an identity: bridged, bare py_function, bare function."""
  with tf.device(_tf_device(device)):
    x_tf = tf.random.normal([64, 32])
  identity_tb = tb.torch_function(lambda x: x, name="identity")

  @tf.function
  def bare_function(x):
    return tf.identity(x)

  @tf.function
  def bare_py_function(x):
    return tf.py_function(lambda v: v, [x], Tout=tf.float32)

  @tf.function
  def bridged_function(x):
    return identity_tb(x)

  @tf.function
  def bridged_py_function(x):
    return identity_tb(x)

  with _loader.python_path():  # traced now, on the tf.py_function path
    bridged_py_function.get_concrete_function(x_tf)
  contenders = {
    "tf.function identity": lambda: bare_function(x_tf),
    "tf.py_function identity (in tf.function)": lambda: bare_py_function(x_tf),
    "torchbridge identity, tf.py_function path (in tf.function)": lambda: bridged_py_function(x_tf),
  }
  if _loader.available():

    @tf.function
    def bare_native_op(x):  # hands its input capsule straight back
      return _op.call(list, [x], [tf.float32], [x.shape])[0]

    def dlpack_round_trip(capsules):  # the least any Python-side bridge does
      return [torch_dlpack.to_dlpack(torch_dlpack.from_dlpack(c)) for c in capsules]

    @tf.function
    def bare_native_op_custom_gradient(x):  # what tf.custom_gradient adds
      @tf.custom_gradient
      def call(v):
        out = _op.call(list, [v], [tf.float32], [v.shape])[0]
        return out, lambda dy: dy

      return call(x)

    @tf.function
    def round_trip_native_op(x):
      return _op.call(dlpack_round_trip, [x], [tf.float32], [x.shape])[0]

    @tf.function
    def torch_tensors_native_op(x):  # the op's C++ conversions only
      return _op.call(
        lambda args_torch, unused: args_torch, [x], [tf.float32], [x.shape], torch_tensors=True
      )[0]

    contenders.update(
      {
        "native op doing nothing (in tf.function)": lambda: bare_native_op(x_tf),
        "native op doing nothing, in tf.custom_gradient (in tf.function)": lambda: (
          bare_native_op_custom_gradient(x_tf)
        ),
        "native op, torch DLPack round trip only (in tf.function)": lambda: round_trip_native_op(
          x_tf
        ),
        "native op, torch tensors handed back (in tf.function)": lambda: torch_tensors_native_op(
          x_tf
        ),
        "torchbridge identity, native op (in tf.function)": lambda: bridged_function(x_tf),
      }
    )
  contenders.update(
    {
      "eager tf.py_function identity": lambda: tf.py_function(lambda v: v, [x_tf], Tout=tf.float32),
      "eager torchbridge identity": lambda: identity_tb(x_tf),
    }
  )
  return harness.interleaved(
    contenders, repeats=7 if quick else 15, calls=100 if quick else 300, warmup=50
  )


def train_steps(model_name, quick, device, threads, log=print):
  """One training step per contender, each contender in processes of its own.

  Every round starts one process per contender (`benchmarks.step_process`),
  the order rotating; a contender's figure is the median over its processes
  of each process's median per-step time.
  """
  names = train_step.contenders(model_name, quick, device)
  repeats = 5 if quick else 7

  def job(name):
    return lambda: harness.run_process(
      "benchmarks.step_process",
      [model_name, name, "--repeats", repeats, "--threads", threads, "--device", device],
      quiet_wait=0 if quick else harness.QUIET_MAX_WAIT,
    )

  runs = harness.alternated(
    {name: job(name) for name in names},
    rounds=1 if quick else 3,
    log=lambda m: log(f"    {model_name} {m}"),
  )
  return {name: harness.over_processes(records) for name, records in runs.items()}


def td3(quick, threads, log=print):
  """The TD3 train step of each backend and its floor, a process each.

  examples/td3_pendulum.py runs 3,000 environment steps (2,000 train steps
  after 1,000 of random actions) per backend; rounds alternate the backends.
  """
  backends = {
    "torchbridge": "torchbridge",
    "pure torch": "torch",
    "keras": "tf",
    FLOOR_TD3: "floor",
    TD3_TORCH_THREAD: "torchbridge",
    LEAN_TD3: "lean-script",
    SCRIPTED_TD3: "scripted-script",
    TORCH_RUNNER_TD3: "torchbridge-torch",
  }
  why_not = scripted_native.unavailable()  # builds its C++ callbacks once, here
  if why_not:
    log(f"    td3: no no-Python bridge contender: {why_not}")
    del backends[SCRIPTED_TD3]
  runs_started = itertools.count()
  with tempfile.TemporaryDirectory(prefix="td3_bench_") as tmp:

    def job(name):
      backend = backends[name]
      return lambda: harness.run_process(
        "benchmarks.td3_process",
        [
          backend,
          "--steps",
          3000,
          "--start-steps",
          1000,
          "--threads",
          threads,
          "--out",
          os.path.join(tmp, f"{next(runs_started)}_{backend}", "run"),
          "--torch-thread",
          "on" if name == TD3_TORCH_THREAD else "script",
        ],
        quiet_wait=0 if quick else harness.QUIET_MAX_WAIT,
      )

    runs = harness.alternated(
      {name: job(name) for name in backends},
      rounds=1 if quick else 3,
      log=lambda m: log(f"    td3 {m}"),
    )
  result = {
    name: harness.over_processes(records, "ms_per_train_step") for name, records in runs.items()
  }
  for name, records in runs.items():
    if records and records[0].get("wall_s") is not None:
      result[name]["wall_s"] = float(np.median([r["wall_s"] for r in records]))
  return result


def torch_after_bridge(quick, threads, log=print):
  """Pure torch on the main thread before and after 1,000 bridged calls."""
  records = []
  for r in range(1 if quick else 3):
    log(f"    process {r + 1}")
    records.append(
      harness.run_process(
        "benchmarks.torch_after_bridge",
        ["--threads", threads],
        quiet_wait=0 if quick else harness.QUIET_MAX_WAIT,
      )
    )
  for record in records:
    record["ratio_right_after"] = record["right_after_us"] / record["before_us"]
    record["ratio_after_pause"] = record["after_pause_us"] / record["before_us"]
  result = harness.over_processes(records, "ratio_right_after")
  result["ratio_after_pause"] = float(np.median([r["ratio_after_pause"] for r in records]))
  return result


def peak_memory(model_name, device):
  """Peak resident memory of training steps, each contender in its own process."""
  results = {}
  for contender in ("torchbridge", "keras"):
    out = subprocess.run(
      [sys.executable, "-m", "benchmarks.memory", contender, model_name, device],
      capture_output=True,
      text=True,
      check=True,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    results[contender] = json.loads(out.stdout.strip().splitlines()[-1])
  return results


def _tf_device(device):
  return "/GPU:0" if device == "cuda" else "/CPU:0"
