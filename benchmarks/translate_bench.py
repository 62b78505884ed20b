"""`tb.translate` as a contender: inference latency and the small-MLP step.

Usage:
  python -m benchmarks.translate_bench [--quick] [--out DIR] [--threads N]
      [--rounds R] [--repeats N]
  python -m benchmarks.translate_bench --process infer|train CONTENDER
      [--models small_mlp,td3_actor] [--calls N] [--repeats N] [--threads N]

The first form runs everything and writes `DIR/translate_bench.json` and
`DIR/translate_bench.md` (DIR: benchmarks/results); the second is one
contender's process (it prints one JSON line), started by the first.

Measured, for the small MLP of benchmarks/models.py (32-256-256-8) and the
TD3 actor of examples/td3 (obs 3, 256-256, tanh, max_action 2):

- inference latency at batch 1 and 256: the bridge (`tb.TorchModule`
  called inside a `tf.function`), the translated module (`served(x)`, its
  own `tf.function`), the translated module with XLA
  (`tb.translate(..., jit_compile=True)`), Keras with the same weights in a
  `tf.function` with and without `jit_compile`, and pure torch (a
  `torch.no_grad` forward);
- the small-MLP training step of benchmarks/train_step.py (batch 64, MSE,
  Adam 1e-4; its `_tf_step` for every TF contender): the bridge, the
  translated module (GradientTape over `served.trainable_variables`, Keras
  Adam), the same step with `jit_compile=True` over the whole step (as
  written, calling `served(x)`, and with the translated graph inlined into
  the step: see `build_train`), Keras (the same weights as torch's) with and
  without `jit_compile`, and pure torch.

Each (kind, contender) runs in a process of its own (harness.run_process:
it waits for a quiet machine first and records the other processes' load);
rounds alternate the contenders in a rotating order; a figure is the
median over processes of each process's median per-call time. Ratios are
per-call times: contender / bridge and contender / Keras (tf.function).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

import torchbridge as tb  # noqa: E402
from torchbridge._native import _loader  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks import train_step  # noqa: E402

BRIDGE = "bridge tf.function"
TRANSLATED = "translated tf.function"
TRANSLATED_XLA = "translated XLA"
TRANSLATED_XLA_INLINED = "translated XLA, served inlined"
KERAS = "keras tf.function"
KERAS_XLA = "keras XLA"
PURE_TORCH = "pure torch"
CONTENDERS = (
  BRIDGE,
  TRANSLATED,
  TRANSLATED_XLA,
  TRANSLATED_XLA_INLINED,
  KERAS,
  KERAS_XLA,
  PURE_TORCH,
)
KINDS = ("infer", "train")
# XLA recompiles a step that calls `served` (its tf.function) on every call
# once the step also updates the variables (see `build_train`): the training
# step is measured that way and also with the translated graph inlined.
CONTENDERS_OF = {
  "infer": tuple(c for c in CONTENDERS if c != TRANSLATED_XLA_INLINED),
  "train": CONTENDERS,
}
INFER_MODELS = ("small_mlp", "td3_actor")
BATCHES = (1, 256)
TRAIN_MODEL = "small_mlp"
TD3_ACTOR = {"obs_dim": 3, "act_dim": 1, "max_action": 2.0}
RESULTS = os.path.join(harness.ROOT, "benchmarks", "results")


def infer_key(model_name, batch):
  return f"inference {model_name} batch {batch}"


def train_key():
  batch = models.MODELS[TRAIN_MODEL][1]
  return f"training step {TRAIN_MODEL} batch {batch}"


def _td3_networks():
  examples = os.path.join(harness.ROOT, "examples")
  if examples not in sys.path:
    sys.path.insert(0, examples)
  from td3 import networks  # pylint: disable=import-outside-toplevel

  return networks


def _torch_model(model_name):
  """The torch model, initialised from torch seed 0 (as train_step does)."""
  torch.manual_seed(0)
  if model_name == "td3_actor":
    return _td3_networks().TorchActor(**TD3_ACTOR)
  return models.torch_model(model_name)


def _in_dim(model_name):
  if model_name == "td3_actor":
    return TD3_ACTOR["obs_dim"]
  return models.MODELS[model_name][0][0]


def _keras_model(model_name, torch_model):
  """The model in Keras, holding the torch model's weights."""
  if model_name == "td3_actor":
    keras_model, dense = _td3_networks().keras_actor(**TD3_ACTOR)
  else:
    keras_model = models.keras_model(model_name)
    dense = [layer for layer in keras_model.layers if layer.weights]
  linears = [m for m in torch_model.modules() if isinstance(m, torch.nn.Linear)]
  if len(linears) != len(dense):
    raise ValueError(
      f"{model_name}: {len(linears)} torch Linear layers, {len(dense)} Keras Dense layers"
    )
  for linear, layer in zip(linears, dense):
    layer.set_weights([linear.weight.detach().numpy().T, linear.bias.detach().numpy()])
  return keras_model


def _translate(bridged, model_name, jit_compile=None):
  return tb.translate(
    bridged, [tf.TensorSpec([None, _in_dim(model_name)], tf.float32)], jit_compile=jit_compile
  )


def inference_input(model_name, batch):
  """The fixed input of a latency timing: random normal, numpy seed 0."""
  return np.random.default_rng(0).standard_normal((batch, _in_dim(model_name)), dtype=np.float32)


def build_forward(contender, model_name):
  """`contender`'s model (one per process, as served): returns a function
  that takes a numpy batch and gives the zero-argument forward on it (the
  forward returns the output tensor)."""
  if contender not in CONTENDERS_OF["infer"]:
    raise ValueError(f"unknown contender {contender!r}; expected one of {CONTENDERS_OF['infer']}")
  torch_model = _torch_model(model_name).eval()
  if contender == PURE_TORCH:

    def on_torch(x_np):
      x_torch = torch.from_numpy(x_np)

      def forward():
        with torch.no_grad():
          return torch_model(x_torch)

      return forward

    return on_torch
  if contender in (KERAS, KERAS_XLA):
    keras_model = _keras_model(model_name, torch_model)
    call = tf.function(lambda x: keras_model(x, training=False), jit_compile=contender == KERAS_XLA)
  else:
    bridged = tb.TorchModule(torch_model, name="bridged")
    if contender == BRIDGE:
      call = tf.function(lambda x: bridged(x))  # pylint: disable=unnecessary-lambda
    else:  # its own tf.function, with the input signature [None, in_dim]
      call = _translate(
        bridged, model_name, jit_compile=(True if contender == TRANSLATED_XLA else None)
      )

  def on_tf(x_np):
    x_tf = tf.constant(x_np)
    return lambda: call(x_tf)

  return on_tf


def build_inference(contender, model_name, batch):
  """The zero-argument forward of `contender` on `inference_input`."""
  return build_forward(contender, model_name)(inference_input(model_name, batch))


def _train_data(model_name):
  """train_step.build's batch: numpy seed 0, inputs then targets."""
  shape_torch, _, shape_target = models.batch_shapes(model_name)
  rng = np.random.default_rng(0)
  x_np = rng.standard_normal(shape_torch, dtype=np.float32)
  y_np = rng.standard_normal(shape_target, dtype=np.float32)
  return x_np, y_np


class _Inlined:
  """`served` with its graph traced into the caller's (its tf.function's
  Python function), not called as a nested function."""

  def __init__(self, served):
    self.trainable_variables = served.trainable_variables
    self._call = served.__call__.python_function

  def __call__(self, *inputs):
    return self._call(*inputs)


def build_train(contender, model_name=TRAIN_MODEL):
  """The zero-argument training step of `contender` (forward, MSE, backward,
  Adam 1e-4: train_step's); it returns the loss before the update.

  TRANSLATED_XLA is `tf.function(step, jit_compile=True)` with the step
  calling `served(x)`; TF 2.21 then compiles the step anew on every call
  (~0.5-1.5 s; XLA's log shows a compilation-cache miss each call). Plain
  TF does the same with any nested tf.function that transposes a variable
  (the translation of `linear` does, `tf.transpose(weight)`) under a tape
  in a jit-compiled step that updates the variable: the gradient needs the
  `perm` as a compile-time constant, and the variables' values apparently
  become part of the compilation key. TRANSLATED_XLA_INLINED traces the
  translated graph straight into the step
  (`served.__call__.python_function`), which compiles once.
  """
  if contender == BRIDGE:
    return train_step.build(model_name, train_step.BRIDGED, "cpu")
  if contender == PURE_TORCH:
    return train_step.build(model_name, train_step.PURE_TORCH, "cpu")
  if contender not in CONTENDERS_OF["train"]:
    raise ValueError(f"unknown contender {contender!r}; expected one of {CONTENDERS_OF['train']}")
  x_np, y_np = _train_data(model_name)
  x_tf, y_tf = tf.constant(x_np), tf.constant(y_np)
  torch_model = _torch_model(model_name)  # train_step.build's initial weights
  if contender in (KERAS, KERAS_XLA):
    model = _keras_model(model_name, torch_model)
  else:  # trained by TF through the translation, the bridge's variables
    model = _translate(tb.TorchModule(torch_model, name="bridged"), model_name)
    if contender == TRANSLATED_XLA_INLINED:
      model = _Inlined(model)
  jit = contender in (KERAS_XLA, TRANSLATED_XLA, TRANSLATED_XLA_INLINED)
  return tf.function(
    train_step._tf_step(model, x_tf, y_tf),  # pylint: disable=protected-access
    jit_compile=jit,
  )


def measure(
  kind, contender, model_names=INFER_MODELS, repeats=7, calls=0, seconds=0.25, first_outputs=None
):
  """Times one contender (in this process) and returns {key: {"median_us",
  "samples_us", "calls"}}. `calls`: per timing; 0: as many as take about
  `seconds` (the calibration warms up); otherwise one warm-up call.
  `first_outputs`: a dict to receive {key: the first call's output (numpy)}:
  the forward's output, the step's loss before its update."""
  if kind == "infer":
    fns = {}
    for m in model_names:
      on = build_forward(contender, m)
      fns.update({infer_key(m, b): on(inference_input(m, b)) for b in BATCHES})
  elif kind == "train":
    fns = {train_key(): build_train(contender)}
  else:
    raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
  out = {}
  for key, fn in fns.items():
    first = fn()  # traces and compiles
    if first_outputs is not None:
      first_outputs[key] = first.detach().numpy() if torch.is_tensor(first) else first.numpy()
    if calls:
      n = calls
    else:
      n = harness.calls_for(fn, seconds)
    samples = harness.timed_repeats(fn, repeats, n)
    out[key] = {"median_us": float(np.median(samples)), "samples_us": samples, "calls": n}
  return out


def record(kind, contender, model_names=INFER_MODELS, repeats=7, calls=0, first_outputs=None):
  """What a contender's process reports: `measure`'s timings, the process
  id, the thread settings, whether the native op is in use."""
  start = time.perf_counter()
  timings = measure(
    kind, contender, model_names, repeats=repeats, calls=calls, first_outputs=first_outputs
  )
  return {
    "pid": os.getpid(),
    "kind": kind,
    "contender": contender,
    "repeats": repeats,
    "timings": timings,
    "process_s": round(time.perf_counter() - start, 2),
    "native": _loader.available(),
    "threads": {
      "torch_intra": torch.get_num_threads(),
      "tf_intra": tf.config.threading.get_intra_op_parallelism_threads(),
    },
  }


def process_main(args):
  """One contender's process: builds, warms up, times; one JSON line."""
  harness.configure_threads(args.threads)
  print(
    json.dumps(
      record(
        args.kind, args.contender, args.models.split(","), repeats=args.repeats, calls=args.calls
      )
    )
  )
  return 0


def summarize(runs):
  """Per measurement and contender, the median over processes, and ratios.

  Args:
    runs: {(kind, contender): [process records, in round order]}.

  Returns:
    {"timings": {key: {contender: harness.over_processes(...)}},
     "ratios": {key: {contender: {"/ bridge", "/ keras"}}},
     "foreign_load_cores": {"median", "max"}}.
  """
  timings = {}
  for (_, contender), records in runs.items():
    keys = [k for r in records for k in r["timings"]]
    for key in dict.fromkeys(keys):
      per_process = [
        {
          **r["timings"][key],
          "pid": r["pid"],
          "foreign_load_cores": r.get("foreign_load_cores"),
          "waited_s": r.get("waited_s"),
        }
        for r in records
        if key in r["timings"]
      ]
      timings.setdefault(key, {})[contender] = harness.over_processes(per_process)
  ratios = {}
  for key, by_contender in timings.items():
    ratios[key] = {}
    for contender, t in by_contender.items():
      ratios[key][contender] = {
        f"/ {ref}": (
          t["median_us"] / by_contender[name]["median_us"] if name in by_contender else None
        )
        for ref, name in (("bridge", BRIDGE), ("keras", KERAS))
      }
  loads = [
    r["foreign_load_cores"]
    for records in runs.values()
    for r in records
    if r.get("foreign_load_cores") is not None
  ]
  return {
    "timings": timings,
    "ratios": ratios,
    "foreign_load_cores": {
      "median": float(np.median(loads)) if loads else None,
      "max": float(np.max(loads)) if loads else None,
    },
  }


def _us(v):
  return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def markdown(results):
  """The table: one row per measurement and contender."""
  lines = [
    "| measurement | contender | median µs/call | min-max over processes | / bridge | / keras |",
    "|---|---|---:|---:|---:|---:|",
  ]
  for key, by_contender in results["timings"].items():
    for contender in CONTENDERS:
      if contender not in by_contender:
        continue
      t = by_contender[contender]
      r = results["ratios"][key][contender]
      ratio = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
      lines.append(
        f"| {key} | {contender} | {_us(t['median_us'])} | "
        f"{_us(t['min'])}-{_us(t['max'])} | "
        f"{ratio(r['/ bridge'])} | {ratio(r['/ keras'])} |"
      )
  load = results["foreign_load_cores"]
  env = results["environment"]
  lines += [
    "",
    f"{results['rounds']} round(s) of one process per contender "
    f"and kind, {results['repeats']} timings per process; "
    f"{env['threads']['requested']} threads, {env['cpu']} "
    f"({env['cpu_count']} cores); torch {env['torch']}, TF "
    f"{env['tensorflow']}; native op: {results['native']}; other "
    f"processes' load during the runs: median "
    f"{load['median'] if load['median'] is not None else 0:.2f} "
    f"cores, max {load['max'] if load['max'] is not None else 0:.2f}.",
  ]
  return "\n".join(lines)


def write(results, out_dir):
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "translate_bench.json")
  with open(path, "w") as f:
    json.dump(results, f, indent=1)
  with open(os.path.join(out_dir, "translate_bench.md"), "w") as f:
    f.write(markdown(results) + "\n")
  return path


def run(quick, threads, rounds=None, repeats=None, models_=INFER_MODELS, log=print, runner=None):
  """All contenders, a process each per kind, alternated over rounds.

  `runner(kind, contender, models_, repeats)` returns one process's record;
  default: harness.run_process of `--process KIND CONTENDER` (tests pass
  one that measures in their own process).
  """
  rounds = rounds or (1 if quick else 3)
  repeats = repeats or (3 if quick else 7)
  quiet = 0 if quick else harness.QUIET_MAX_WAIT
  start = time.time()

  def in_a_process(kind, contender, models_, repeats):
    return harness.run_process(
      "benchmarks.translate_bench",
      [
        "--process",
        kind,
        contender,
        "--models",
        ",".join(models_),
        "--repeats",
        repeats,
        "--threads",
        threads,
      ],
      quiet_wait=quiet,
    )

  runner = runner or in_a_process
  names = {f"{kind}: {c}": (kind, c) for kind in KINDS for c in CONTENDERS_OF[kind]}
  runs = harness.alternated(
    {name: (lambda k=key: runner(*k, models_, repeats)) for name, key in names.items()},
    rounds,
    log=lambda m: log(f"[{time.time() - start:5.0f} s] {m}"),
  )
  results = summarize({names[name]: records for name, records in runs.items()})
  results.update(
    quick=quick,
    rounds=rounds,
    repeats=repeats,
    environment=harness.environment(threads, "cpu"),
    native=_loader.available(),
    failed_processes=harness.FAILURES,
    seconds=round(time.time() - start, 1),
  )
  return results


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.translate_bench", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument(
    "--quick", action="store_true", help="one round, 3 timings per process, no quiet wait"
  )
  parser.add_argument("--out", default=RESULTS)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--rounds", type=int, default=0)
  parser.add_argument("--repeats", type=int, default=0)
  parser.add_argument(
    "--models", default=",".join(INFER_MODELS), help="inference models, comma-separated"
  )
  parser.add_argument(
    "--process",
    nargs=2,
    metavar=("KIND", "CONTENDER"),
    help="be one contender's process (KIND: infer, train)",
  )
  parser.add_argument(
    "--calls", type=int, default=0, help="(--process) calls per timing; 0: ~0.25 s worth"
  )
  args = parser.parse_args(argv)
  if args.process:
    args.kind, args.contender = args.process
    if args.kind not in KINDS or args.contender not in CONTENDERS_OF.get(args.kind, ()):
      parser.error(f"--process KIND CONTENDER: KIND in {KINDS}, CONTENDER in {CONTENDERS_OF}")
    args.repeats = args.repeats or 7
    return process_main(args)

  harness.configure_threads(args.threads)
  print(f"translate benchmark: {args.threads} threads per process, quick={args.quick}", flush=True)
  results = run(
    args.quick,
    args.threads,
    args.rounds,
    args.repeats,
    tuple(args.models.split(",")),
    log=lambda m: print(m, flush=True),
  )
  table = markdown(results)
  print()
  print(table)
  path = write(results, args.out)
  print(f"\nwrote {path} in {results['seconds']:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
