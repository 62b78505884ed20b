"""Where a bridged training step's time goes, every millisecond accounted for.

`python -m benchmarks.step_breakdown [--steps N] [--out DIR]` takes, for the
TD3 train step (examples/td3, random batches of Pendulum's shapes) and the
small-MLP step of `make bench`, on the native op:
  1. the step's time, unprofiled (the median of N timed steps, the loss
     fetched, as `make bench` times it);
  2. N more steps under TF's profiler, with `tb.timeline()`'s annotations
     on, each step marked by a `train_step` span; and splits each profiled
     step's wall time, instant by instant, into rows: at each instant, each
     thread's innermost span is found (TF's op and runtime events, the
     bridge's kernel and Python phases), and the instant goes to the most
     specific of them over all threads (torch's forward or backward first,
     then the bridge's phases, TF's ops, TF's runtime; no span on any thread
     is "no thread working"). The rows therefore add up to the profiled
     step exactly; the profiled step against the unprofiled one says what
     profiling itself costs.
Writes step_breakdown.json and step_breakdown.md, and the last recorded
step of each as a Chrome / Perfetto trace (step_trace_NAME.json) and a
picture (step_trace_NAME.png).
"""

import argparse
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

import torchbridge as tb  # noqa: E402
from torchbridge import _native  # noqa: E402
from torchbridge import _timeline  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks import train_step  # noqa: E402

sys.path.insert(0, os.path.join(harness.ROOT, "examples"))
from td3 import agents  # noqa: E402  pylint: disable=wrong-import-position

STEP = "train_step"
TF_SIDE = ("TF's side: ops, runtime, the Python call (outside every bridged "
           "call)")
TF_OPS = "TF ops (kernels: loss, Keras Adam, Polyak updates, ...)"
NO_THREAD = "no thread working"
TORCH = {_timeline.FORWARD: "torch: forward (the user's module)",
         _timeline.BACKWARD: "torch: backward (autograd engine)"}
# Each bridge phase's row: what its exclusive time is.
BRIDGE = {
    "torchbridge/kernel": "bridge: kernel, outside its phases",
    "torchbridge/wait for torch thread": "bridge: hand-off to and back from "
                                         "the torch thread",
    "torchbridge/torch thread": "bridge: hand-off to and back from the "
                                "torch thread",
    "torchbridge/wrap inputs": "bridge: inputs wrapped, adopted (C++)",
    "torchbridge/adopt outputs": "bridge: inputs wrapped, adopted (C++)",
    "torchbridge/acquire GIL": "bridge: acquiring the GIL",
    "torchbridge/callback (GIL held)": "bridge: torch tensors in and out (C++)"
                                       ", Python dispatch",
    _timeline.CALL: "bridge: Python call, outside its phases",
    _timeline.BIND: "bridge: binding arguments, slots, buffers",
    _timeline.CHECK: "bridge: checking outputs",
    _timeline.SAVE: "bridge: saving state for the backward",
}


def _td3_step():
  agent = agents.TFAgent("torchbridge", 3, 1, 2.0, 0, agents.Hyper())
  rng = np.random.default_rng(0)
  n = agent.hyper.batch_size

  def step():
    batch = (rng.standard_normal((n, 3), dtype=np.float32),
             rng.uniform(-2, 2, (n, 1)).astype(np.float32),
             rng.standard_normal((n, 1), dtype=np.float32),
             rng.standard_normal((n, 3), dtype=np.float32),
             np.ones((n, 1), np.float32))
    return tuple(float(v) for v in agent.train_step(*batch))
  return step


def _mlp_step():
  step = train_step.build("small_mlp", train_step.BRIDGED, "cpu")
  return lambda: float(step())


STEPS = {"td3": _td3_step, "small_mlp": _mlp_step}


def classify(name):
  """(category, row) of a span name."""
  if name in TORCH:
    return "torch", TORCH[name]
  if name in BRIDGE:
    return "bridge", BRIDGE[name]
  if name.startswith("torchbridge/"):
    return "bridge", "bridge: " + name.split("/", 1)[1]
  if name.endswith(":TorchbridgeCall"):
    return "bridge", "bridge: TF's op event around the kernel"
  if ":" in name.replace("::", "") and not name.startswith("EagerLocal"):
    return "tf op", TF_OPS  # "op name:op type", a kernel's own event
  return "tf runtime", "TF runtime (executor, function call, Python)"


def _events(logdir):
  """(name, thread, begin_ns, end_ns) of every host event profiled."""
  [path] = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
  space = xplane_pb2.XSpace()
  with open(path, "rb") as f:
    space.ParseFromString(f.read())
  events = []
  for plane in space.planes:
    if not plane.name.startswith("/host:CPU"):
      continue
    names = {k: m.name for k, m in plane.event_metadata.items()}
    for line in plane.lines:
      for e in line.events:
        begin = line.timestamp_ns + e.offset_ps // 1000
        events.append((names.get(e.metadata_id, "?"), line.id, begin,
                       begin + e.duration_ps // 1000))
  return events


def split_step(events, begin, end):
  """{row: ns} for [begin, end): each instant to its most specific span."""
  inside = [e for e in events if e[3] > begin and e[2] < end and
            e[0] != STEP]
  cuts = sorted({begin, end} | {max(begin, min(end, t)) for e in inside
                                for t in (e[2], e[3])})
  rows = {}
  for t0, t1 in zip(cuts, cuts[1:]):
    if t1 <= t0:
      continue
    mid = (t0 + t1) / 2
    innermost = {}
    for e in inside:
      if e[2] <= mid < e[3]:
        best = innermost.get(e[1])
        if best is None or (e[2], -e[3]) > (best[2], -best[3]):
          innermost[e[1]] = e
    if not innermost:
      row = NO_THREAD
    else:
      # The span begun last is the one running: those begun earlier on
      # other threads are waiting for it (the Python thread in the
      # function call, TF's thread for the torch thread).
      row = classify(max(innermost.values(), key=lambda e: e[2])[0])[1]
    rows[row] = rows.get(row, 0) + (t1 - t0)
  return rows


def _rows(events, step_events, idle_row):
  """Mean ms per step of each row over `step_events`, and their sum."""
  per_step = []
  for e in step_events:
    rows = split_step(events, e[2], e[3])
    if NO_THREAD in rows:
      rows[idle_row] = rows.pop(NO_THREAD)
    per_step.append(rows)
  names = sorted({r for s in per_step for r in s})
  # Means, so that the rows add up to the mean step.
  return {r: float(np.mean([s.get(r, 0) for s in per_step])) / 1e6
          for r in names}


def timeline_pass(step, steps):
  """The steps recorded by `tb.timeline(annotate=False)` alone (no
  profiler): the bridge's phases measured, TF's side the rest."""
  marks = []
  with tb.timeline(annotate=False) as trace:
    for _ in range(steps):
      start = time.perf_counter_ns()
      step()
      marks.append((start, time.perf_counter_ns()))
  events = [(e["name"], e["thread"], e["begin_ns"], e["end_ns"])
            for e in trace.events]
  step_events = [(STEP, 0, b, e) for b, e in marks]
  rows = _rows(events, step_events, TF_SIDE)
  begin, end = marks[-1]
  last = [e for e in trace.events if e["end_ns"] > begin and
          e["begin_ns"] < end]
  return {"step_mean_ms": float(np.mean([(e - b) / 1e6 for b, e in marks])),
          "rows_ms": rows, "rows_sum_ms": float(sum(rows.values())),
          "last_step": {"begin_ns": begin, "end_ns": end, "events": last}}


def plot_step(name, last_step, path):
  """One recorded step's spans, a lane per thread and nesting depth."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  events = sorted(last_step["events"], key=lambda e: (e["begin_ns"],
                                                      -e["end_ns"]))
  origin = last_step["begin_ns"]
  lanes, ends = {}, {}  # (thread, depth) -> lane; lane -> end of last span
  placed = []
  for e in events:
    depth = 0
    while ends.get((e["thread"], depth), -1) > e["begin_ns"]:
      depth += 1
    ends[(e["thread"], depth)] = e["end_ns"]
    lanes.setdefault((e["thread"], depth), None)
    placed.append((e, (e["thread"], depth)))
  order = {lane: k for k, lane in enumerate(sorted(lanes))}
  colors = {}
  fig, ax = plt.subplots(figsize=(13, 0.42 * len(order) + 1.6))
  cmap = plt.get_cmap("tab20")
  for e, lane in placed:
    color = colors.setdefault(e["name"], cmap(len(colors) % 20))
    ax.barh(order[lane], (e["end_ns"] - e["begin_ns"]) / 1e6,
            left=(e["begin_ns"] - origin) / 1e6, color=color,
            edgecolor="black", linewidth=0.3, label=e["name"])
  handles, labels = ax.get_legend_handles_labels()
  unique = dict(zip(labels, handles))
  ax.legend(unique.values(), [l.replace("torchbridge/", "") for l in unique],
            loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4,
            fontsize=8, frameon=False)
  threads = sorted({t for t, _ in order})
  ax.set_yticks(range(len(order)))
  ax.set_yticklabels([f"thread {threads.index(t) + 1}, depth {d}"
                      for t, d in sorted(order)], fontsize=8)
  ax.invert_yaxis()
  ax.set_xlim(0, (last_step["end_ns"] - origin) / 1e6)
  ax.set_xlabel("ms since the step began (the rest of the step: TF's side)")
  ax.set_title(f"One {name} train step through torchbridge, "
               "tb.timeline(annotate=False)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def measure(name, steps):
  step = STEPS[name]()
  for _ in range(20):
    step()
  durations = []
  for _ in range(steps):
    start = time.perf_counter()
    step()
    durations.append(time.perf_counter() - start)
  unprofiled_ms = 1e3 * float(np.median(durations))
  recorded = timeline_pass(step, steps)
  with tempfile.TemporaryDirectory(prefix="tb_breakdown_") as logdir:
    marks = []
    with tb.timeline():
      tf.profiler.experimental.start(logdir)
      try:
        for i in range(steps):
          with tf.profiler.experimental.Trace(STEP, step_num=i):
            start = time.perf_counter_ns()
            step()
            marks.append((start, time.perf_counter_ns()))
      finally:
        tf.profiler.experimental.stop()
    events = _events(logdir)
  step_events = sorted((e for e in events if e[0] == STEP),
                       key=lambda e: e[2])
  mean_rows = _rows(events, step_events, NO_THREAD)
  op_types = {}
  for begin, end in ((e[2], e[3]) for e in step_events):
    for e in events:
      if begin <= e[2] < end and classify(e[0])[1] == TF_OPS:
        kind = e[0].rsplit(":", 1)[1]
        op_types[kind] = op_types.get(kind, 0) + (e[3] - e[2]) / 1e6 / len(
            step_events)
  return {"unprofiled_median_ms": unprofiled_ms,
          "unprofiled_mean_ms": 1e3 * float(np.mean(durations)),
          "profiled_mean_ms": float(np.mean(
              [(e[3] - e[2]) / 1e6 for e in step_events])),
          "rows_ms": mean_rows, "steps": len(step_events),
          "timeline": recorded,
          "rows_sum_ms": float(sum(mean_rows.values())),
          "tf_op_types_ms": dict(sorted(op_types.items(),
                                        key=lambda kv: -kv[1])[:8])}


def _table(title, rows_ms, step_label, step_ms):
  """A markdown table of rows, largest first, ending with their sum."""
  total = sum(rows_ms.values())
  lines = [title, "", "| row | ms per step (mean) | share |", "|---|---|---|"]
  for row, ms in sorted(rows_ms.items(), key=lambda kv: -kv[1]):
    lines.append(f"| {row} | {ms:.3f} | {ms / total:.0%} |")
  return lines + [f"| **sum of the rows** (the {step_label} step: "
                  f"{step_ms:.2f}) | {total:.2f} | |", ""]


def markdown(results):
  lines = []
  for name, r in results["steps"].items():
    t = r["timeline"]
    lines += _table(
        f"### {name}, recorded by tb.timeline(annotate=False): "
        f"{t['step_mean_ms']:.2f} ms a step (unprofiled: "
        f"{r['unprofiled_mean_ms']:.2f}; mean of {r['steps']})",
        t["rows_ms"], "recorded", t["step_mean_ms"])
    lines += _table(
        f"### {name}, under TF's profiler: {r['profiled_mean_ms']:.2f} ms a "
        f"step (unprofiled: {r['unprofiled_mean_ms']:.2f}, median "
        f"{r['unprofiled_median_ms']:.2f}; mean of {r['steps']})",
        r["rows_ms"], "profiled", r["profiled_mean_ms"])
    lines += ["TF ops by type, ms per step: " + ", ".join(
        f"{k} {v:.3f}" for k, v in r["tf_op_types_ms"].items()), ""]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.step_breakdown",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--only", choices=sorted(STEPS))
  parser.add_argument("--out", default=os.path.join(harness.ROOT, "benchmarks",
                                                    "results"))
  args = parser.parse_args(argv)
  if not _native.available():
    print(f"the native op is not available: {_native.status()}")
    return 1
  harness.configure_threads(args.threads)
  results = {"threads": args.threads, "steps": {}}
  for name in [args.only] if args.only else list(STEPS):
    results["steps"][name] = measure(name, args.steps)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  for name, r in results["steps"].items():
    last = r["timeline"].pop("last_step")
    trace = _timeline.Timeline()
    trace.events = last["events"]
    trace.save(out / f"step_trace_{name}.json")
    plot_step(name, last, out / f"step_trace_{name}.png")
  (out / "step_breakdown.json").write_text(json.dumps(results, indent=2) +
                                           "\n")
  (out / "step_breakdown.md").write_text(markdown(results))
  print(markdown(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
