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
     bridge's kernel and Python phases), and the instant goes to the one
     of them begun last over all threads (those begun earlier on other
     threads are waiting for it; no span on any thread is "no thread
     working"). Every instant goes to one row, so the rows add up to the
     step they split by construction: that is no check. The checks are two
     independent clocks: time.perf_counter around the very same recorded
     (or profiled) steps, which the rows over all of them must match (the
     split neither loses nor invents time), and the unrecorded step, timed
     in blocks alternated with the recorded ones: the recorded step against
     it is what recording itself costs ("recording_overhead",
     "profiling_overhead"), the rows against it "rows_over_unrecorded".
In the same alternated blocks as the unprofiled step, three comparisons:
the floor (the same TF program, each bridged module a bare native op), the
floor whose ops take and hand back torch tensors, and the same ops running
the same torch modules through the leanest Python bridge one can write
(`bare_native.LeanTorchModule`): what is left of the bridge's share once
that one is taken out is torchbridge's own Python. For TD3, also the
step on the C++ torch runner (`run="torch"`: each module captured with
`torch.export`, its graph calls run from the native op's kernel in C++: no
Python per call),
unrecorded and recorded, against its own floor (the same ops handing back
fresh torch tensors from C++): what is left once Python is taken out
altogether.
Writes step_breakdown.json and step_breakdown.md, and the last recorded
step of each as a Chrome / Perfetto trace (step_trace_NAME.json) and a
picture (step_trace_NAME.png).
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: F401  (before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

import torchbridge as tb  # noqa: E402
from torchbridge._native import _loader  # noqa: E402
from torchbridge._runtime import _timeline  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks import scripted_native  # noqa: E402
from benchmarks import train_step  # noqa: E402

sys.path.insert(0, os.path.join(harness.ROOT, "examples"))
from td3 import agents  # noqa: E402  pylint: disable=wrong-import-position

STEP = "train_step"
# Steps per block; the recorded, unrecorded and floor blocks alternate.
BLOCK = 10
# Where graph calls run: TORCHBRIDGE_TORCH_THREAD for each placement.
PLACEMENTS = {"torch-thread": "1", "tf-thread": "0"}
TF_SIDE = "TF's side: ops, runtime, the Python call (outside every bridged call)"
TF_OPS = "TF ops (kernels: loss, Keras Adam, Polyak updates, ...)"
TF_RUNTIME = "TF runtime (executor, function call, Python)"
NO_THREAD = "no thread working"
TORCH = {
  _timeline.FORWARD: "torch: forward (the user's module)",
  _timeline.BACKWARD: "torch: backward (autograd engine)",
}
# Each bridge phase's row: what its exclusive time is.
BRIDGE = {
  "torchbridge/kernel": "bridge: kernel, outside its phases",
  "torchbridge/wait for torch thread": "bridge: hand-off to and back from the torch thread",
  "torchbridge/torch thread": "bridge: hand-off to and back from the torch thread",
  "torchbridge/wrap inputs": "bridge: inputs wrapped, adopted (C++)",
  "torchbridge/adopt outputs": "bridge: inputs wrapped, adopted (C++)",
  "torchbridge/acquire GIL": "bridge: acquiring the GIL",
  "torchbridge/callback (GIL held)": "bridge: torch tensors in and out (C++), Python dispatch",
  _timeline.CALL: "bridge: Python call, outside its phases",
  _timeline.BIND: "bridge: binding arguments, slots, buffers",
  _timeline.CHECK: "bridge: checking outputs",
  _timeline.SAVE: "bridge: saving state for the backward",
}


def _on_random_batches(agent):
  """`agent`'s train step on random batches of Pendulum's shapes, the
  losses fetched."""
  rng = np.random.default_rng(0)
  n = agent.hyper.batch_size

  def step():
    batch = (
      rng.standard_normal((n, 3), dtype=np.float32),
      rng.uniform(-2, 2, (n, 1)).astype(np.float32),
      rng.standard_normal((n, 1), dtype=np.float32),
      rng.standard_normal((n, 3), dtype=np.float32),
      np.ones((n, 1), np.float32),
    )
    return tuple(float(v) for v in agent.train_step(*batch))

  return step


def _td3_step():
  # The bridge's phases: graph calls through the bridge (run="torch") on
  # its Python path (the C++ torch runner is the step of `_no_python_steps`).
  agent = agents.TFAgent("torchbridge", 3, 1, 2.0, 0, agents.Hyper(), run="torch")
  for module in (agent.actor, agent.critic, agent.actor_target, agent.critic_target):
    module._runners.torch_runner.enabled = False  # pylint: disable=protected-access
  return _on_random_batches(agent)


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
  return "tf runtime", TF_RUNTIME


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
        events.append(
          (names.get(e.metadata_id, "?"), line.id, begin, begin + e.duration_ps // 1000)
        )
  return events


def split_step(events, begin, end):
  """{row: ns} for [begin, end): each instant to its most specific span."""
  inside = [e for e in events if e[3] > begin and e[2] < end and e[0] != STEP]
  cuts = sorted({begin, end} | {max(begin, min(end, t)) for e in inside for t in (e[2], e[3])})
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


def _middle(durations):
  """Indices of the steps between the 10th and 90th percentile of
  `durations`: this machine's steps have a long tail (a 40-step window's
  mean ranges 9-19 ms), so every figure here is a mean over the middle 80%,
  recorded and unrecorded steps alike."""
  low, high = np.percentile(durations, [10, 90])
  return [i for i, d in enumerate(durations) if low <= d <= high]


def _trimmed_mean(durations):
  return float(np.mean([durations[i] for i in _middle(durations)]))


def _per_step_rows(events, step_events, idle_row):
  """`split_step` of each of `step_events`, {row: ns} each."""
  per_step = []
  for e in step_events:
    rows = split_step(events, e[2], e[3])
    if NO_THREAD in rows:
      rows[idle_row] = rows.pop(NO_THREAD)
    per_step.append(rows)
  return per_step


def _rows(events, step_events, idle_row):
  """Mean ms per step of each row over the middle 80% of `step_events`."""
  per_step = _per_step_rows(events, step_events, idle_row)
  middle = _middle([e[3] - e[2] for e in step_events])
  names = sorted({r for s in per_step for r in s})
  # Means, so that the rows add up to the mean step.
  return {r: float(np.mean([per_step[i].get(r, 0) for i in middle])) / 1e6 for r in names}


def _rows_all_steps_ms(events, step_events, idle_row):
  """The rows' sum, ms per step, over every one of `step_events` (not only
  the middle 80%): what an independent clock around the same steps must
  match."""
  per_step = _per_step_rows(events, step_events, idle_row)
  return float(sum(sum(rows.values()) for rows in per_step)) / 1e6 / max(1, len(per_step))


def _no_python_steps(name):
  """For TD3, (the step on the C++ torch runner: each module captured and
  run from the native ops' kernel in C++, no Python per call; its floor,
  the same ops handing back fresh torch tensors from C++,
  `scripted_native.NoPythonFloorModule`). (None, None) for the small MLP,
  or where they cannot run."""
  if name != "td3" or scripted_native.unavailable():
    return None, None
  from benchmarks import td3_process  # pylint: disable=import-outside-toplevel

  agent = agents.TFAgent("torchbridge", 3, 1, 2.0, 0, agents.Hyper(), run="torch")
  return (
    _on_random_batches(agent),
    _on_random_batches(td3_process.bare_native_agent(kind="no-python-floor")),
  )


def _floor_step(name, torch_outputs=False, lean=False):
  """The same step with every bridged module a bare native op (no torch):
  the TF program around the bridged calls, their crossings included. With
  `torch_outputs`, the ops take torch tensors and hand back fresh ones, as
  a zero-copy bridge's must (`bare_native.BareNativeModule`). With `lean`,
  the ops run the torch modules through the leanest Python bridge
  (`bare_native.LeanTorchModule`)."""
  if name == "td3":
    from benchmarks import td3_process  # pylint: disable=import-outside-toplevel

    agent = td3_process.bare_native_agent(
      torch_outputs=torch_outputs, kind="lean" if lean else "bare"
    )
    return _on_random_batches(agent)
  if lean:
    contender = train_step.LEAN_BRIDGE
  else:
    contender = train_step.FLOOR_TORCH_OUTPUTS if torch_outputs else train_step.FLOOR
  floor = train_step.build("small_mlp", contender, "cpu")
  return lambda: float(floor())


def _timed(step, durations):
  start = time.perf_counter_ns()
  step()
  end = time.perf_counter_ns()
  durations.append((end - start) / 1e6)
  return start, end


def timeline_pass(
  step, floor, steps, floor_torch=None, lean=None, scripted=None, scripted_floor=None
):
  """Blocks of BLOCK steps, alternated: unrecorded, recorded by
  `tb.timeline(annotate=False)` alone (no profiler), the floor step, and
  (given) the floor step with torch tensors in and out of its ops, the
  step through the leanest Python bridge, and the step with
  modules on the C++ torch runner (no Python per call), unrecorded and recorded
  in turn as the bridged step is (its kernels' phases: the C++ callback is
  torch's compute through torch's dispatcher), with its floor (the same
  ops, fresh torch tensors handed back from C++).
  Alternating keeps them on the same stretch of this noisy machine, so the
  recorded rows can be held against the unrecorded step. Each recorded
  block's counted steps are also timed as a whole with time.perf_counter
  (the loop between them included): a clock the timeline's rows over the
  same steps must match."""
  marks, plain_ms, recorded_ms, floor_ms, events = [], [], [], [], []
  floor_torch_ms, lean_ms = [], []
  scripted_ms, scripted_recorded_ms, scripted_marks, scripted_events = [], [], [], []
  scripted_floor_ms = []
  walls_s, scripted_walls_s = [], []

  def scripted_plain_block():
    scripted()
    for _ in range(BLOCK):
      _timed(scripted, scripted_ms)

  def scripted_recorded_block():
    with tb.timeline(annotate=False) as trace:
      scripted()
      wall = time.perf_counter()
      for _ in range(BLOCK):
        scripted_marks.append(_timed(scripted, scripted_recorded_ms))
      scripted_walls_s.append(time.perf_counter() - wall)
    scripted_events.extend(trace.events)

  def plain_block():
    step()
    for _ in range(BLOCK):
      _timed(step, plain_ms)

  def recorded_block():
    with tb.timeline(annotate=False) as trace:
      step()  # its spans lie outside every mark: no row counts them
      wall = time.perf_counter()
      for _ in range(BLOCK):
        marks.append(_timed(step, recorded_ms))
      walls_s.append(time.perf_counter() - wall)
    events.extend(trace.events)

  for k in range(max(1, steps // BLOCK)):
    # Each block begins with a step it does not count, and the unrecorded
    # and recorded blocks take turns to follow the floor's: the first steps
    # after another program's block run slower (measured: by 5-10 ms).
    for block in (plain_block, recorded_block) if k % 2 == 0 else (recorded_block, plain_block):
      block()
    floor()
    for _ in range(BLOCK):
      _timed(floor, floor_ms)
    for other, durations in (
      (floor_torch, floor_torch_ms),
      (lean, lean_ms),
      (scripted_floor, scripted_floor_ms),
    ):
      if other is not None:
        other()
        for _ in range(BLOCK):
          _timed(other, durations)
    if scripted is not None:
      # In turn after another program's block, as the bridged step's two.
      pair = (scripted_plain_block, scripted_recorded_block)
      for block in pair if k % 2 == 0 else pair[::-1]:
        block()
  spans = [(e["name"], e["thread"], e["begin_ns"], e["end_ns"]) for e in events]
  step_events = [(STEP, 0, b, e) for b, e in marks]
  rows = _rows(spans, step_events, TF_SIDE)
  begin, end = marks[-1]
  last = [e for e in events if e["end_ns"] > begin and e["begin_ns"] < end]
  torch_ms = sum(rows.get(r, 0.0) for r in TORCH.values())
  step_ms, floor_mean = _trimmed_mean(plain_ms), _trimmed_mean(floor_ms)
  recorded_mean = _trimmed_mean(recorded_ms)
  rows_sum = float(sum(rows.values()))
  return {
    # The recorded step (its perf_counter_ns marks, the window the rows
    # split) and, the independent clock, the unrecorded step (timeline off,
    # alternated blocks); both means of the middle 80%.
    "step_mean_ms": recorded_mean,
    "unrecorded_mean_ms": step_ms,
    "unrecorded_median_ms": float(np.median(plain_ms)),
    # What recording costs: the recorded step over the unrecorded one.
    "recording_overhead": recorded_mean / step_ms,
    # The rows' sum (the recorded step) over the unrecorded step.
    "rows_over_unrecorded": rows_sum / step_ms,
    # The same recorded steps, all of them, on two clocks: time.perf_counter
    # around each block of them (the loop between steps included), and the
    # rows' sum: ms per step. The rows must not lose or invent time.
    "recorded_wall_ms": float(sum(walls_s)) * 1e3 / len(marks),
    "rows_all_steps_ms": _rows_all_steps_ms(spans, step_events, TF_SIDE),
    "floor_mean_ms": floor_mean,
    "torch_compute_ms": torch_ms,
    # What is left of the unrecorded step once the TF side's floor and
    # torch's own forwards and backwards are taken out.
    "bridge_share_ms": step_ms - floor_mean - torch_ms,
    # The same against the floor whose ops take and make torch tensors.
    "floor_torch_outputs_mean_ms": (_trimmed_mean(floor_torch_ms) if floor_torch_ms else None),
    "bridge_share_over_torch_floor_ms": (
      step_ms - _trimmed_mean(floor_torch_ms) - torch_ms if floor_torch_ms else None
    ),
    # The same step through the leanest Python bridge on the same ops.
    "lean_bridge_mean_ms": _trimmed_mean(lean_ms) if lean_ms else None,
    # The same step on the C++ torch runner (no Python per call), its
    # recorded rows and its floor.
    "cpp_runner_mean_ms": _trimmed_mean(scripted_ms) if scripted_ms else None,
    "cpp_runner_recorded_mean_ms": (
      _trimmed_mean(scripted_recorded_ms) if scripted_recorded_ms else None
    ),
    "cpp_runner_rows_ms": _scripted_rows(scripted_events, scripted_marks)
    if scripted_marks
    else None,
    "cpp_runner_recording_overhead": (
      _trimmed_mean(scripted_recorded_ms) / _trimmed_mean(scripted_ms) if scripted_ms else None
    ),
    "cpp_runner_recorded_wall_ms": (
      float(sum(scripted_walls_s)) * 1e3 / len(scripted_marks) if scripted_marks else None
    ),
    "cpp_runner_rows_all_steps_ms": _scripted_rows_all_steps_ms(scripted_events, scripted_marks)
    if scripted_marks
    else None,
    "no_python_floor_mean_ms": _trimmed_mean(scripted_floor_ms) if scripted_floor_ms else None,
    "rows_ms": rows,
    "rows_sum_ms": rows_sum,
    "steps": len(marks),
    "last_step": {"begin_ns": begin, "end_ns": end, "events": last},
  }


# The C++ torch runner's kernel phases: its callback runs no Python, only
# torch (one dispatcher call per ATen node, autograd) and DLPack in C++.
SCRIPTED_CALLBACK = "torch, run from C++: forwards and backwards, DLPack in and out"


def _scripted_rows(events, marks):
  spans = [(e["name"], e["thread"], e["begin_ns"], e["end_ns"]) for e in events]
  rows = _rows(spans, [(STEP, 0, b, e) for b, e in marks], TF_SIDE)
  callback = "bridge: C++ callback"  # classify()'s row for its phase
  if callback in rows:
    rows[SCRIPTED_CALLBACK] = rows.pop(callback)
  return rows


def _scripted_rows_all_steps_ms(events, marks):
  spans = [(e["name"], e["thread"], e["begin_ns"], e["end_ns"]) for e in events]
  return _rows_all_steps_ms(spans, [(STEP, 0, b, e) for b, e in marks], TF_SIDE)


# The step pictures' colours: one per kind of span, as the rows group them.
PLOT_KINDS = (
  ("torch: forward", "tab:green", lambda n: n == _timeline.FORWARD),
  ("torch: backward", "tab:purple", lambda n: n == _timeline.BACKWARD),
  ("bridge, Python phases", "tab:orange", lambda n: n in _PYTHON_PHASES),
  ("bridge, C++: kernel, hand-offs, GIL", "tab:blue", lambda n: n.startswith("torchbridge/")),
  ("other", "tab:gray", lambda n: True),
)
_PYTHON_PHASES = {_timeline.CALL, _timeline.BIND, _timeline.CHECK, _timeline.SAVE}


# Short names of the spans, for the pictures' lanes.
SHORT = {
  "torchbridge/wait for torch thread": "waits for torch",
  "torchbridge/torch thread": "hand-off",
  "torchbridge/callback (GIL held)": "callback",
  _timeline.CALL: "Python call",
  _timeline.FORWARD: "forward",
  _timeline.BACKWARD: "backward",
}


def _short(name):
  return SHORT.get(name, name.replace("torchbridge/", ""))


def _lane_labels(placed, order):
  """Each lane's label: its thread's role (the torch thread, TF's thread
  that runs the kernels) and the spans that fill most of it."""
  names = {}
  for e, _ in placed:
    names.setdefault(e["thread"], set()).add(e["name"])
  roles = {}
  for thread, held in names.items():
    if "torchbridge/torch thread" in held:
      roles[thread] = "torch"
    elif "torchbridge/kernel" in held:
      roles[thread] = "TF"
    else:
      roles[thread] = f"thread {len(roles) + 1}"
  time_in = {}
  for e, lane in placed:
    spans = time_in.setdefault(lane, {})
    spans[e["name"]] = spans.get(e["name"], 0) + e["end_ns"] - e["begin_ns"]
  labels = []
  for lane in sorted(order, key=order.get):
    spans = time_in[lane]
    total = sum(spans.values())
    main = [n for n, t in sorted(spans.items(), key=lambda kv: -kv[1]) if t >= 0.2 * total]
    labels.append(f"{roles[lane[0]]} thread: {', '.join(_short(n) for n in main[:2])}")
  return labels


# What the pages call each step, each placement and each runner measured.
STEP_TITLES = {"td3": "TD3 train step", "small_mlp": "Small MLP train step"}
PLACEMENT_TITLES = {"torch-thread": "the torch thread", "tf-thread": "TF's thread"}
PYTHON_PATH_TITLE = '`run="torch"`, Python path'
CPP_RUNNER_TITLE = '`run="torch"` from C++'
# The TF ops' row of each step, by what its kernels run (the small MLP's
# step has no target networks, so no Polyak updates).
TF_OPS_TITLES = {"small_mlp": "TF ops (kernels: the loss, Keras Adam)"}
PLOT_STEPS = {"td3": "TD3", "small_mlp": "small-MLP"}


def torch_build(version):
  """A torch version as a picture's title names it: "torch 2.13 (CPU
  build)", "torch 2.15 (CUDA build)"; None: not recorded."""
  if not version:
    return "torch build not recorded"
  release = ".".join(version.split("+")[0].split(".")[:2])
  if version.endswith("+cpu"):
    return f"torch {release} (CPU build)"
  if "+cu" in version:
    return f"torch {release} (CUDA build)"
  return f"torch {release}"


def plot_title(name, placement, torch_version):
  """A step picture's title: the step, the runner (`run="torch"`'s Python
  path, the one these pictures record), where graph calls run, and the
  torch build (`torch_version`, None where it was not recorded)."""
  return (
    f"One {PLOT_STEPS.get(name, name)} train step, phase by phase: "
    f"{PYTHON_PATH_TITLE.replace('`', '')}\n"
    f"graph calls on {PLACEMENT_TITLES.get(placement, placement)}; {torch_build(torch_version)}"
  )


def plot_step(title, last_step, path):
  """One recorded step's spans, a lane per thread and nesting depth,
  coloured by kind, drawn to be read at the docs' column width (~690 px),
  under `title` (`plot_title`). `last_step`: {"begin_ns", "end_ns",
  "events"}; with "bounds": False the bounds are the spans' own (a trace
  saved without the step's)."""
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  from matplotlib.patches import Patch  # pylint: disable=import-outside-toplevel
  from matplotlib.ticker import MaxNLocator  # pylint: disable=import-outside-toplevel

  events = sorted(last_step["events"], key=lambda e: (e["begin_ns"], -e["end_ns"]))
  origin = last_step["begin_ns"]
  ends = {}  # (thread, depth) -> end of its last span
  placed = []
  for e in events:
    depth = 0
    while ends.get((e["thread"], depth), -1) > e["begin_ns"]:
      depth += 1
    ends[(e["thread"], depth)] = e["end_ns"]
    placed.append((e, (e["thread"], depth)))
  # TF's thread (the kernels') first, then each thread's lanes, outermost first.
  first = {}
  for e, _ in placed:
    first.setdefault(e["thread"], len(first))
  lanes = sorted(ends, key=lambda lane: (first[lane[0]], lane[1]))
  order = {lane: k for k, lane in enumerate(lanes)}
  fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(order) + 2.7))
  used = {}
  for e, lane in placed:
    label, color, _ = next(k for k in PLOT_KINDS if k[2](e["name"]))
    used[label] = color
    ax.barh(
      order[lane],
      (e["end_ns"] - e["begin_ns"]) / 1e6,
      left=(e["begin_ns"] - origin) / 1e6,
      height=0.7,
      color=color,
      edgecolor="white",
      linewidth=0.4,
    )
  ax.set_yticks(range(len(order)))
  ax.set_yticklabels(_lane_labels(placed, order), fontsize=10)
  ax.invert_yaxis()
  ax.set_xlim(0, (last_step["end_ns"] - origin) / 1e6)
  ax.xaxis.set_major_locator(MaxNLocator(6))
  ax.tick_params(axis="x", labelsize=10)
  ax.set_xlabel(
    "ms since the step began (blank: TF's side, no bridged call)"
    if last_step.get("bounds", True)
    else "ms from the step's first bridged call to its last",
    fontsize=10,
  )
  # Centred on the figure, not the axes (its lane labels take the left).
  fig.suptitle(title, fontsize=11)
  ax.legend(
    handles=[Patch(color=c, label=k) for k, c in used.items()],
    loc="upper center",
    bbox_to_anchor=(0.5, -0.22),
    ncol=2,
    fontsize=10,
    frameon=False,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  plt.close(fig)


def last_step_from_trace(path):
  """`plot_step`'s `last_step` from a saved step_trace_NAME.json: the
  step's bounds from its metadata, or (traces saved before they were
  written there) the spans' own, "bounds": False."""
  trace = json.loads(Path(path).read_text())
  events = [
    {
      "name": e["name"],
      "thread": e["tid"],
      "begin_ns": round(e["ts"] * 1e3),
      "end_ns": round((e["ts"] + e["dur"]) * 1e3),
    }
    for e in trace["traceEvents"]
  ]
  meta = trace.get("metadata", {})
  if "step_begin_us" in meta:
    return {
      "begin_ns": round(meta["step_begin_us"] * 1e3),
      "end_ns": round(meta["step_end_us"] * 1e3),
      "events": events,
    }
  return {
    "begin_ns": min(e["begin_ns"] for e in events),
    "end_ns": max(e["end_ns"] for e in events),
    "events": events,
    "bounds": False,
  }


def replot(out, torch_version=None):
  """Draws step_trace_NAME.png again from each step_trace_NAME.json in
  `out`: no measuring. `torch_version`: the torch the traces were recorded
  with, for the titles (the traces do not record it); None: "not
  recorded"."""
  for path in sorted(Path(out).glob("step_trace_*.json")):
    stem = path.stem[len("step_trace_") :]
    name, placement = (
      (stem[: -len("_tf_thread")], "tf-thread")
      if stem.endswith("_tf_thread")
      else (stem, "torch-thread")
    )
    plot_step(
      plot_title(name, placement, torch_version),
      last_step_from_trace(path),
      path.with_suffix(".png"),
    )


def _profiled(step, steps):
  """`steps` steps under TF's profiler (and the bridge's annotations):
  every host event, the steps' own, and each step's wall time in ms by
  time.perf_counter around it (a clock independent of the profiler's)."""
  walls_ms = []
  with tempfile.TemporaryDirectory(prefix="tb_breakdown_") as logdir:
    with tb.timeline():
      tf.profiler.experimental.start(logdir)
      try:
        for i in range(steps):
          start = time.perf_counter()
          with tf.profiler.experimental.Trace(STEP, step_num=i):
            step()
          walls_ms.append((time.perf_counter() - start) * 1e3)
      finally:
        tf.profiler.experimental.stop()
    events = _events(logdir)
  step_events = sorted((e for e in events if e[0] == STEP), key=lambda e: e[2])
  return events, step_events, walls_ms


def measure(name, steps):
  step, floor = STEPS[name](), _floor_step(name)
  floor_torch = _floor_step(name, torch_outputs=True)
  lean = _floor_step(name, lean=True)
  scripted, scripted_floor = _no_python_steps(name)
  for _ in range(20):
    step()
    floor()
    floor_torch()
    lean()
    if scripted is not None:
      scripted()
      scripted_floor()
  recorded = timeline_pass(step, floor, steps, floor_torch, lean, scripted, scripted_floor)
  events, step_events, walls_ms = _profiled(step, steps)
  mean_rows = _rows(events, step_events, NO_THREAD)
  op_types = {}
  for begin, end in ((e[2], e[3]) for e in step_events):
    for e in events:
      if begin <= e[2] < end and classify(e[0])[1] == TF_OPS:
        kind = e[0].rsplit(":", 1)[1]
        op_types[kind] = op_types.get(kind, 0) + (e[3] - e[2]) / 1e6 / len(step_events)
  profiled_ms = [(e[3] - e[2]) / 1e6 for e in step_events]
  # The floor under the same profiler: its TF ops and runtime against the
  # bridged step's (the same TF program; what differs is what runs between).
  floor_events, floor_steps, _ = _profiled(floor, steps)
  floor_rows = _rows(floor_events, floor_steps, NO_THREAD)
  profiled_mean, rows_sum = _trimmed_mean(profiled_ms), float(sum(mean_rows.values()))
  return {
    "unprofiled_median_ms": recorded["unrecorded_median_ms"],
    "unprofiled_mean_ms": recorded["unrecorded_mean_ms"],
    # The profiler's own step spans (its clock), the middle 80%.
    "profiled_mean_ms": profiled_mean,
    "profiling_overhead": profiled_mean / recorded["unrecorded_mean_ms"],
    "rows_over_unprofiled": rows_sum / recorded["unrecorded_mean_ms"],
    # All the profiled steps on two clocks, ms per step: time.perf_counter
    # around each, and the rows' sum over the profiler's step spans.
    "profiled_wall_ms": float(np.mean(walls_ms)),
    "profiled_all_steps_ms": float(np.mean(profiled_ms)),
    "rows_all_steps_ms": _rows_all_steps_ms(events, step_events, NO_THREAD),
    "rows_ms": mean_rows,
    "steps": len(step_events),
    "floor_profiled_rows_ms": floor_rows,
    "timeline": recorded,
    "rows_sum_ms": rows_sum,
    "tf_op_types_ms": dict(sorted(op_types.items(), key=lambda kv: -kv[1])[:8]),
  }


ROWS_HEADER = (
  "| row: the step's time spent there (each instant of the step goes to one "
  "row: the span begun last on any thread) | ms per step (mean of the middle "
  "80%) | share of the rows |"
)


def _table(title, rows_ms, step_label, step_ms, clocks=()):
  """A markdown table of rows, largest first, their sum, then `clocks`:
  (what an independent clock measures, its ms per step, what the rows are
  against it)."""
  total = sum(rows_ms.values())
  lines = [title, "", ROWS_HEADER, "|---|---|---|"]
  for row, ms in sorted(rows_ms.items(), key=lambda kv: -kv[1]):
    lines.append(f"| {row} | {ms:.3f} | {ms / total:.0%} |")
  lines.append(
    f"| **sum of the rows** = the {step_label} step ({step_ms:.2f} ms; equal "
    f"by construction, no check) | {total:.2f} | |"
  )
  for label, ms, against in clocks:
    lines.append(f"| *independent clock:* {label} | {ms:.2f} | {against} |")
  return lines + [""]


def _cost(how, ratio):
  """What recording (`how`: "recorded", "profiled") costs, as the recorded
  step over the unrecorded one says it: under 1, within the noise."""
  doing = how.replace("ed", "ing")
  if ratio < 1:
    return f"{how} / un{how} step: {ratio:.3f}x (under 1: what {doing} costs is within the noise)"
  return f"{how} / un{how} step: {ratio:.3f}x (what {doing} costs)"


def _clocks(rows_sum, recorded_ms, unrecorded_ms, wall_ms, rows_all_ms, steps, how):
  """`_table`'s independent clocks of a recorded (`how`: "recorded",
  "profiled") step: the wall time of the very same steps, where measured
  (results before it have none), and the step with recording off."""
  off = "timeline off" if how == "recorded" else "no profiler, no timeline"
  clocks = []
  if wall_ms is not None:
    clocks.append(
      (
        f"time.perf_counter around the same {how} steps, all {steps} (the "
        f"loop between them included)",
        wall_ms,
        f"the rows over all {steps}: {rows_all_ms:.2f} ({rows_all_ms / wall_ms - 1:+.1%})",
      )
    )
  clocks.append(
    (
      f"the un{how} step ({off}; time.perf_counter, blocks alternated with the {how} ones)",
      unrecorded_ms,
      f"the rows {rows_sum / unrecorded_ms - 1:+.1%} of it; "
      + _cost(how, recorded_ms / unrecorded_ms),
    )
  )
  return clocks


def _heading(name, runner, placement):
  """A step's heading: the step, the runner, where graph calls run."""
  return (
    f"## {STEP_TITLES.get(name, name)}, {runner}, graph calls on "
    f"{PLACEMENT_TITLES.get(placement, placement)}"
  )


def _step_markdown(name, r, placement):
  t = r["timeline"]
  step_ms = t["unrecorded_mean_ms"]
  tf_ops = TF_OPS_TITLES.get(name, TF_OPS)
  lines = _table(
    f"{_heading(name, PYTHON_PATH_TITLE, placement)}\n\n"
    f"Recorded by `tb.timeline(annotate=False)`: {t['step_mean_ms']:.2f} ms a "
    f"step; unrecorded, in alternated blocks: {step_ms:.2f} ms (the mean of "
    f"the middle 80% of {t['steps']} steps each).",
    t["rows_ms"],
    "recorded",
    t["step_mean_ms"],
    _clocks(
      t["rows_sum_ms"],
      t["step_mean_ms"],
      step_ms,
      t.get("recorded_wall_ms"),
      t.get("rows_all_steps_ms"),
      t["steps"],
      "recorded",
    ),
  )
  lines += [
    f"- The same step with bare native ops (TF's side, its crossings "
    f"included; alternated blocks): {t['floor_mean_ms']:.2f} ms. torch's "
    f"forwards and backwards: {t['torch_compute_ms']:.2f} ms. The "
    f"bridge's share (unrecorded step - floor - torch): "
    f"{t['bridge_share_ms']:.2f} ms, "
    f"{t['bridge_share_ms'] / step_ms:.0%} of the step.",
  ]
  if t.get("floor_torch_outputs_mean_ms") is not None:
    lines.append(
      f"- The floor with torch tensors in and out of its ops (fresh torch "
      f"outputs that TF adopts and frees through torch, as any zero-copy "
      f"bridge's op hands back; alternated blocks): "
      f"{t['floor_torch_outputs_mean_ms']:.2f} ms. The bridge's share over "
      f"it: {t['bridge_share_over_torch_floor_ms']:.2f} ms, "
      f"{t['bridge_share_over_torch_floor_ms'] / step_ms:.0%} of the step."
    )
  if t.get("lean_bridge_mean_ms") is not None:
    lean_ms = t["lean_bridge_mean_ms"]
    lines.append(
      f"- The same ops running the same torch modules through the leanest "
      f"Python bridge (`bare_native.LeanTorchModule`: the parameters swapped "
      f"in, the module run, `torch.autograd.grad`; none of torchbridge's "
      f"Python; alternated blocks): {lean_ms:.2f} ms; torchbridge's step "
      f"{step_ms:.2f} ms, {step_ms / lean_ms:.2f}x it. Its own share over the "
      f"torch-tensor floor and torch: "
      f"{lean_ms - (t['floor_torch_outputs_mean_ms'] or t['floor_mean_ms']) - t['torch_compute_ms']:.2f} ms."
    )
  if t.get("cpp_runner_mean_ms") is not None:
    lines += _scripted_lines(t, step_ms)
  lines.append("")
  lines += _table(
    "### The same step under TF's profiler\n\n"
    f"Under TF's profiler, with the bridge's annotations: "
    f"{r['profiled_mean_ms']:.2f} ms a step (the mean of the middle 80% of "
    f"{r['steps']} profiled steps); unprofiled: {r['unprofiled_mean_ms']:.2f} ms, "
    "the unrecorded step of the section above (its alternated blocks, the "
    "mean of the middle 80%).",
    {(tf_ops if row == TF_OPS else row): ms for row, ms in r["rows_ms"].items()},
    "profiled",
    r["profiled_mean_ms"],
    _clocks(
      r["rows_sum_ms"],
      r["profiled_mean_ms"],
      r["unprofiled_mean_ms"],
      r.get("profiled_wall_ms"),
      r.get("rows_all_steps_ms"),
      r["steps"],
      "profiled",
    ),
  )
  lines += [
    "TF ops by type, ms per step: "
    + ", ".join(f"{k} {v:.3f}" for k, v in r["tf_op_types_ms"].items()),
    "",
  ]
  floor_rows = r["floor_profiled_rows_ms"]
  lines += [
    "TF's side, the bridged step against the floor under the same "
    "profiler, ms per step: "
    + ", ".join(
      f"{row.split(' (')[0]} {r['rows_ms'].get(row, 0):.3f} against {floor_rows.get(row, 0):.3f}"
      for row in (TF_OPS, TF_RUNTIME)
    )
    + f"; the floor's step {sum(floor_rows.values()):.2f} ms.",
    "",
  ]
  if t.get("cpp_runner_mean_ms") is not None:
    lines += _scripted_markdown(name, t, placement)
  return lines


def _scripted_lines(t, step_ms):
  """The C++ torch runner's line among the Python path's comparisons."""
  scripted_ms, floor_ms = t["cpp_runner_mean_ms"], t["no_python_floor_mean_ms"]
  rows = t["cpp_runner_rows_ms"]
  compute = rows.get(SCRIPTED_CALLBACK, 0.0)
  share = scripted_ms - floor_ms - compute
  lines = [
    f'- The same step on the C++ torch runner (`tb.TorchModule(..., run="torch")`: each '
    f"module captured with torch.export, its graph calls run from the native op's "
    f"kernel in C++: no Python per call; alternated blocks): "
    f"{scripted_ms:.2f} ms; the Python path's step {step_ms / scripted_ms:.2f}x "
    f"it. Its floor, the same ops handing back fresh torch tensors from C++ "
    f"(`scripted_native.NoPythonFloorModule`; alternated blocks): {floor_ms:.2f} ms. "
    f"Recorded ({t['cpp_runner_recorded_mean_ms']:.2f} ms a step), its C++ "
    f"callbacks (torch's compute, DLPack in and out) take {compute:.2f} ms; "
    f"its share (its step - its floor - its callbacks): {share:.2f} ms, "
    f"{share / scripted_ms:.0%} of its step.",
  ]
  return lines


def _scripted_markdown(name, t, placement):
  """The C++ torch runner's recorded rows, under a heading of their own."""
  scripted_ms, rows = t["cpp_runner_mean_ms"], t["cpp_runner_rows_ms"]
  lines = _table(
    f"{_heading(name, CPP_RUNNER_TITLE, placement)}\n\n"
    "The C++ torch runner's step, recorded by `tb.timeline(annotate=False)`: "
    f"{t['cpp_runner_recorded_mean_ms']:.2f} ms a step; unrecorded, in "
    f"alternated blocks: {scripted_ms:.2f} ms (the mean of the middle 80% of "
    f"{t['steps']} steps each).",
    rows,
    "recorded",
    t["cpp_runner_recorded_mean_ms"],
    _clocks(
      sum(rows.values()),
      t["cpp_runner_recorded_mean_ms"],
      scripted_ms,
      t.get("cpp_runner_recorded_wall_ms"),
      t.get("cpp_runner_rows_all_steps_ms"),
      t["steps"],
      "recorded",
    ),
  )
  return lines


def markdown(results):
  lines = []
  for placement, steps in results["placements"].items():
    for name, r in steps.items():
      lines += _step_markdown(name, r, placement)
  return "\n".join(lines)


def _run_placement(placement, args):
  """One placement's measurements, in a process of its own (the placement
  is read once, by the first graph call)."""
  with tempfile.TemporaryDirectory(prefix="tb_breakdown_") as out:
    argv = [
      sys.executable,
      "-m",
      "benchmarks.step_breakdown",
      "--placement",
      placement,
      "--steps",
      str(args.steps),
      "--threads",
      str(args.threads),
      "--out",
      out,
      "--no-plot",
    ]
    if args.only:
      argv += ["--only", args.only]
    subprocess.run(
      argv,
      cwd=harness.ROOT,
      check=True,
      stdout=sys.stderr,
      env=dict(os.environ, TORCHBRIDGE_TORCH_THREAD=PLACEMENTS[placement]),
    )
    return json.loads((Path(out) / "step_breakdown.json").read_text())


def _write(results, out, plots):
  """The traces and pictures of each last recorded step, the JSON, the
  markdown."""
  out.mkdir(parents=True, exist_ok=True)
  for placement, steps in results["placements"].items():
    suffix = "" if placement == "torch-thread" else "_" + placement.replace("-", "_")
    for name, r in steps.items():
      last = r["timeline"].pop("last_step")
      trace = _timeline.Timeline()
      trace.events = last["events"]
      chrome = trace.chrome_trace()
      # The step's own bounds, on the trace's time axis (microseconds from
      # its first span), so that the picture can be drawn again from it.
      origin = min((e["begin_ns"] for e in last["events"]), default=last["begin_ns"])
      chrome.setdefault("metadata", {}).update(
        step_begin_us=(last["begin_ns"] - origin) / 1e3,
        step_end_us=(last["end_ns"] - origin) / 1e3,
      )
      (out / f"step_trace_{name}{suffix}.json").write_text(json.dumps(chrome))
      if plots:
        plot_step(
          plot_title(name, placement, torch.__version__),
          last,
          out / f"step_trace_{name}{suffix}.png",
        )
  (out / "step_breakdown.json").write_text(json.dumps(results, indent=2) + "\n")
  (out / "step_breakdown.md").write_text(markdown(results))


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.step_breakdown", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument(
    "--steps", type=int, default=200, help="recorded steps (as many unrecorded and floor)"
  )
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--only", choices=sorted(STEPS))
  parser.add_argument(
    "--placement",
    default="both",
    choices=["both"] + sorted(PLACEMENTS),
    help="where graph calls run: the torch thread (the "
    "default) or TF's own thread (TORCHBRIDGE_TORCH_THREAD"
    "=0); both: one process each",
  )
  parser.add_argument(
    "--no-plot", action="store_true", help="keep the last step's events in the JSON instead"
  )
  parser.add_argument(
    "--replot",
    action="store_true",
    help="measure nothing: draw OUT's step_trace_*.png again from its step_trace_*.json",
  )
  parser.add_argument(
    "--torch-version",
    help="with --replot: the torch version the traces were recorded with, for the "
    "pictures' titles (the traces do not record it)",
  )
  parser.add_argument("--out", default=os.path.join(harness.ROOT, "benchmarks", "results"))
  args = parser.parse_args(argv)
  if args.replot:
    replot(args.out, args.torch_version)
    return 0
  if not _loader.available():
    print(f"the native op is not available: {_loader.status()}")
    return 1
  results = {"threads": args.threads, "block_steps": BLOCK, "placements": {}}
  if args.placement == "both":
    for placement in PLACEMENTS:
      results["placements"].update(_run_placement(placement, args)["placements"])
  else:
    os.environ["TORCHBRIDGE_TORCH_THREAD"] = PLACEMENTS[args.placement]
    harness.configure_threads(args.threads)
    results["placements"][args.placement] = {
      name: measure(name, args.steps) for name in ([args.only] if args.only else list(STEPS))
    }
    if args.no_plot:
      (Path(args.out) / "step_breakdown.json").write_text(json.dumps(results) + "\n")
      return 0
  _write(results, Path(args.out), plots=True)
  print(markdown(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
