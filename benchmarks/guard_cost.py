"""Where the C++ torch runner's per-call cost over a bare op goes.

Usage: python -m benchmarks.guard_cost [--repeats N] [--out DIR]

One forward graph call of `Linear(4, 4)` on a batch of 1 (the per-call row
of `benchmarks/runners.py`), in one process, the contenders interleaved
(`harness.interleaved`, the order rotating each round):

- `tb.TorchModule(..., run="torch")` as users get it: the C++ torch runner,
  and the stale-state check before each call of the `tf.function` (a
  call-time capture of TF's that runs Python, `_guard.add_guard`);
- the same module with that check left out (`_before_calls.before_each_call` made a no-op while
  the call is traced): what the runner costs without it;
- the bare op the runners table compares against
  (`scripted_native.NoPythonFloorModule`: the same variables read, one
  native op whose C++ callback hands back fresh outputs, no torch compute);
- the same bare op with torch's own work put back
  (`scripted_native.TorchLinearFloorModule`: its C++ callback runs
  `at::linear` on the op's input and parameters, no recording): what any
  bridge that runs the module's torch in the call pays at the least. In
  the call, torch's code and data have left the core's caches while TF ran,
  so it costs more than the same op in a loop (the last row); and the
  same with `aten::linear` called through the dispatcher's boxed call
  (`boxed=True`: an IValue stack, as the runner calls each node of the
  exported graph): what interpreting the graph adds to torch's work;
- TF's call-time capture alone: a `tf.function` multiplying its input by
  a captured variable (as the module's call reads its variables) with a
  call-time capture whose closure returns a constant, typed as the check's
  is (`_before_calls.CheckType`) and by a `tf.TensorSpec` (what TF's own
  validation of the value costs), against the same function without it:
  TF's mechanism for running Python before each call, what a check
  through it pays whatever the check does;
- TF's Python before its executor runs the function (the function's
  lookup, the binding of its inputs, the captured inputs: what
  `tracing_compilation.call_function` does before `_call_flat`, TF's
  private code timed as it is), with and without that call-time capture:
  the capture's cost on the Python path alone, free of the executor's
  round-to-round variation;
- the check's own Python: what the runner's check runs before each call
  (`_guard.check` on the runner graph's entries: the module's
  `before_call` and `Snapshot.first_change`), called from Python in a loop;
- the same `aten.linear`, eagerly from Python in a loop (its parameters
  requiring grad): torch's own work as pure torch runs it, warm.

So the runner's gap over the bare op splits into the check (the first two
rows' difference), of which TF's capture machinery is the capture rows'
difference and the rest the check's own Python, torch's own work in the
call (the torch floor over the bare op), and the runner's own C++ beyond it (the check-free runner over the
torch floor): the only part of the C++ a bridge could remove.
Writes `guard_cost.json` and `guard_cost.md` to `--out`.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

import torchbridge as tb  # noqa: E402
from benchmarks import harness  # noqa: E402
from torchbridge._frameworks import _compat  # noqa: E402
from torchbridge._native import _loader  # noqa: E402
from torchbridge._state import _before_calls  # noqa: E402

RUNNER = 'run="torch" (C++ torch runner), as users get it'
NO_CHECK = 'run="torch", the stale-state check left out'
BARE = "bare op, C++ callback (no torch compute)"
TORCH_CPP = "bare op whose C++ callback runs at::linear (torch's own work, in the call)"
TORCH_CPP_BOXED = (
  "the same, aten::linear through the dispatcher's boxed call (as the runner's nodes)"
)
CAPTURE = "tf.function with one call-time capture of the check's type (x * v, v a variable)"
CAPTURE_SPEC = "tf.function with one call-time capture typed by a tf.TensorSpec (x * v)"
PLAIN = "tf.function without it (x * v: the variable captured by value, as a module's are)"
PRE_CAPTURE = "TF's Python before the executor, with the call-time capture (x * v)"
PRE_PLAIN = "TF's Python before the executor, without it (x * v)"
GUARD = (
  "the check's own Python (before_call and Snapshot.first_change of the runner's graph), "
  "from Python in a loop"
)
TORCH = "aten.linear on the same shapes, eagerly from Python in a loop (warm), autograd recording"


def contenders():
  """{name: a zero-argument call}, each traced and called once."""
  from benchmarks import scripted_native  # pylint: disable=import-outside-toplevel

  x = tf.ones([1, 4])

  def module_call(check):
    torch.manual_seed(0)
    module = tb.TorchModule(torch.nn.Linear(4, 4), name="linear", run="torch")
    call = tf.function(lambda v: module(v))
    real = _before_calls.before_each_call
    if not check:
      _before_calls.before_each_call = lambda *args, **kwargs: None
    try:
      call(x)
    finally:
      _before_calls.before_each_call = real
    return lambda: call(x)

  bare_module = scripted_native.NoPythonFloorModule(torch.nn.Linear(4, 4))
  bare = tf.function(lambda v: bare_module(v))
  torch.manual_seed(0)
  linear_module = scripted_native.TorchLinearFloorModule(torch.nn.Linear(4, 4))
  torch_cpp = tf.function(lambda v: linear_module(v))
  torch.manual_seed(0)
  boxed_module = scripted_native.TorchLinearFloorModule(torch.nn.Linear(4, 4), boxed=True)
  torch_cpp_boxed = tf.function(lambda v: boxed_module(v))
  zero = tf.constant(0)
  scale = tf.Variable(2.0)

  def with_capture(spec):
    @tf.function
    def times_scale(v):
      _compat.function_graph().capture_call_time_value(
        lambda: zero, spec, key="guard_cost", default_value=zero
      )
      return v * scale

    return times_scale

  with_check_type = with_capture(_before_calls.CheckType())
  with_spec = with_capture(tf.TensorSpec([], tf.int32))

  @tf.function
  def plain(v):
    return v * scale

  linear = torch.nn.Linear(4, 4)
  x_torch = torch.ones(1, 4)
  aten_linear = torch.ops.aten.linear.default

  runner_call = module_call(check=True)
  # What the check before each call of the runner's graph runs
  # (its callbacks: `_guard.check` on the capture's watch and the modes of
  # a training=None call, the views of the variables taken back): the only
  # graph with callbacks here, of one module.
  graphs = [g for g in _before_calls._CALLBACKS.values() if g]
  if len(graphs) != 1:
    raise RuntimeError(f"expected the runner's one checked graph, found {graphs}")
  callbacks = graphs[0].values()

  def guard():
    for callback in list(callbacks):
      callback()

  calls = {
    PRE_CAPTURE: before_execution(with_check_type, x),
    PRE_PLAIN: before_execution(plain, x),
    RUNNER: runner_call,
    NO_CHECK: module_call(check=False),
    BARE: lambda: bare(x),
    TORCH_CPP: lambda: torch_cpp(x),
    TORCH_CPP_BOXED: lambda: torch_cpp_boxed(x),
    CAPTURE: lambda: with_check_type(x),
    CAPTURE_SPEC: lambda: with_spec(x),
    PLAIN: lambda: plain(x),
    TORCH: lambda: aten_linear(x_torch, linear.weight, linear.bias),
    GUARD: guard,
  }
  for call in calls.values():
    call()
  return calls


def before_execution(function, x):
  """A call of what TF's `tracing_compilation.call_function` runs before
  its executor (`_call_flat`) for `function(x)`: the concrete function's
  lookup (the call-time captures' types in its key), the binding of the
  inputs and the captured inputs (the call-time captures' closures run).
  TF's private code, for this measurement only."""
  from tensorflow.python.eager.polymorphic_function import tracing_compilation  # noqa: PLC0415

  function(x)  # traced and called: its configuration made
  options = function._variable_creation_config  # what __call__ uses here (no variables made)

  def call():
    concrete = tracing_compilation.trace_function(args=(x,), kwargs={}, tracing_options=options)
    bound = concrete.function_type.bind(x)
    concrete.function_type.unpack_inputs(bound)
    return concrete.captured_inputs

  return call


SPAN = "torchbridge/C++ callback"


def callback_spans(calls, repeats, calls_per_timing):
  """{name: median us} of the op's C++ callback in each call (the span
  `tb.timeline` times in C++ around it), for the contenders with one, the
  rounds interleaved as `harness.interleaved`'s. The whole call's time
  varies from round to round by more than the parts compared here; the
  span holds only the callback."""
  names = [n for n in (RUNNER, NO_CHECK, TORCH_CPP_BOXED, TORCH_CPP, BARE) if n in calls]
  samples = {name: [] for name in names}
  for r in range(repeats):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      with tb.timeline(annotate=False) as trace:
        for _ in range(calls_per_timing):
          calls[name]()
      spans = [(e["end_ns"] - e["begin_ns"]) / 1e3 for e in trace.events if e["name"] == SPAN]
      if len(spans) != calls_per_timing:
        raise RuntimeError(
          f"{name}: {len(spans)} C++ callback spans for {calls_per_timing} calls (a call "
          "took the Python path: unset TORCHBRIDGE_TORCH_RUNNER, and see `python -m "
          "torchbridge info`)"
        )
      samples[name] += spans
  return {name: float(np.median(v)) for name, v in samples.items()}


def measure(repeats, calls_per_timing, threads):
  harness.configure_threads(threads)
  calls = contenders()
  timings = harness.interleaved(calls, repeats, calls_per_timing, warmup=50)
  return {
    "environment": harness.environment(threads, "cpu"),
    "repeats": repeats,
    "calls_per_timing": calls_per_timing,
    "median_us": {name: t["median_us"] for name, t in timings.items()},
    "timings": timings,
    "callback_median_us": callback_spans(calls, repeats, calls_per_timing),
  }


def markdown(result):
  m = result["median_us"]
  commit = result["environment"]["source"]["commit"] or "an unknown commit"
  lines = [
    f"Measured at {commit[:10]}: one forward graph call of Linear(4, 4) on a batch of 1, "
    f"in one process, interleaved ({result['repeats']} rounds of "
    f"{result['calls_per_timing']} calls, medians; torch {result['environment']['torch']}, "
    f"{result['environment']['threads']['requested']} threads).",
    "",
    "| call | us | over the bare op, us |",
    "|---|---|---|",
  ]
  for name in (RUNNER, NO_CHECK, TORCH_CPP_BOXED, TORCH_CPP, BARE):
    lines.append(f"| {name} | {m[name]:.1f} | {m[name] - m[BARE]:+.1f} |")
  lines += [
    "",
    "| the op's C++ callback in the call (tb.timeline's span) | us | over the bare op's, us |",
    "|---|---|---|",
  ]
  cb = result["callback_median_us"]
  for name in (RUNNER, NO_CHECK, TORCH_CPP_BOXED, TORCH_CPP, BARE):
    lines.append(f"| {name} | {cb[name]:.1f} | {cb[name] - cb[BARE]:+.1f} |")
  lines += [
    "",
    "| TF's call-time capture | us |",
    "|---|---|",
    f"| {CAPTURE} | {m[CAPTURE]:.1f} |",
    f"| {CAPTURE_SPEC} | {m[CAPTURE_SPEC]:.1f} |",
    f"| {PLAIN} | {m[PLAIN]:.1f} |",
    f"| {PRE_CAPTURE} | {m[PRE_CAPTURE]:.1f} |",
    f"| {PRE_PLAIN} | {m[PRE_PLAIN]:.1f} |",
    f"| {GUARD} | {m[GUARD]:.1f} |",
    "",
    "| torch in a loop | us |",
    "|---|---|",
    f"| {TORCH} | {m[TORCH]:.1f} |",
    "",
    f"The runner over the bare op: {m[RUNNER] - m[BARE]:+.1f} us; of it the stale-state "
    f"check {m[RUNNER] - m[NO_CHECK]:+.1f} us (TF's call-time capture alone: "
    f"{m[CAPTURE] - m[PLAIN]:+.1f} us, of it in TF's Python before the executor "
    f"{m[PRE_CAPTURE] - m[PRE_PLAIN]:+.1f} us; the check's own Python: {m[GUARD]:.1f} us), torch's own work in the call "
    f"{m[TORCH_CPP] - m[BARE]:+.1f} us (in a loop from Python: {m[TORCH]:.1f} us), and the "
    f"runner's own C++ beyond torch's work {m[NO_CHECK] - m[TORCH_CPP]:+.1f} us. Timed in C++ "
    f"(the callback's span), torch's own work in the call is {cb[TORCH_CPP] - cb[BARE]:+.1f} us "
    f"and the runner's C++ beyond it {cb[RUNNER] - cb[TORCH_CPP]:+.1f} us (without the check "
    f"{cb[NO_CHECK] - cb[TORCH_CPP]:+.1f} us), of which calling the op boxed "
    f"{cb[TORCH_CPP_BOXED] - cb[TORCH_CPP]:+.1f} us.",
    "",
  ]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.guard_cost", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("--repeats", type=int, default=21)
  parser.add_argument("--calls", type=int, default=500)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--out", default="benchmarks/results")
  args = parser.parse_args(argv)
  if not _loader.has_torch_interop():
    print(f"the C++ torch runner needs the complete native op: {_loader.status()}")
    return 1
  result = measure(args.repeats, args.calls, args.threads)
  harness.write_results(args.out, "guard_cost", result, markdown(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
