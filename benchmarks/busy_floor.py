"""The C++ torch runner's TD3 step against its floor with torch's time put
back: is what it costs beyond its floor and torch's work the bridge's?

Usage:
  python -m benchmarks.busy_floor [--python PY [--python PY2]] [--processes 3]
      [--rounds 12] [--steps 20] [--out DIR]
  python -m benchmarks.busy_floor --one ...   (one process; prints its JSON)

`benchmarks/step_breakdown.py` found the TD3 step on the C++ torch runner
(`run="torch"`) 0.97 ms over its floor (the same TF program, each bridged
module a bare native op, `scripted_native.NoPythonFloorModule`) plus
torch's work in its callbacks, and found where: TF's side of the step
(its ops, its runtime, every instant outside the bridged calls) took
about 1 ms longer than in the floor. This asks whose that is. In one
process, blocks of steps alternated (the order rotating each round), on
`benchmarks.runners`' batches:

- the step on the C++ torch runner, as `benchmarks.runners` times it, and
  on the torch runner's Python path (the same modules, the C++ runner
  turned off);
- its floor, each callback instant;
- the floor with each callback working as long as the runner's take (the
  mean of the runner's callbacks recorded so far in this process, set
  before each round; the same time for each callback): spinning on the
  clock alone (a long op in TF's graph, nothing else), writing over 4 MiB
  of memory (a long op that evicts the caches' lines), or running torch
  matmuls of 128 x 128 on torch's threads (torch's own work, its OpenMP
  team included). None of them runs any of the bridge beyond the floor's
  op;
- pure torch with the actor's loss differentiated for the actor's
  parameters only (`benchmarks.runners`' reference for this step), on the
  same batches as NumPy arrays; and the same with its optimizers' steps
  and its target networks' updates left out: its forwards and backwards,
  the torch work the runner's callbacks run (and the few torch ops of the
  losses, which the bridged step runs as TF ops).

Two OpenMP teams alive at once slow every parallel region of both
(`torchbridge/_runtime/_omp_team.py`): pure torch's team is the user's
thread's, the others' the torch thread's. So each block begins after
`IDLE_S` without work (the torch thread releases its team after 5 ms
idle), and the user's thread releases its team after pure torch's block,
as the bridge does when it traces. (Without that release the runner's
step measured 2.0x pure torch's here.)

Each contender's steps are timed unrecorded, and (but the Python path's
and pure torch's) again recorded by `tb.timeline(annotate=False)` and split as step_breakdown
splits the runner's: TF's side (every instant outside the bridge's
spans), the callbacks, the hand-off to the torch thread. Each figure is a
mean over the middle 80% of its steps (`step_breakdown._trimmed_mean`).
`--processes` processes a venv, the venvs alternated; each figure is the
median over a venv's processes. Writes `busy_floor.json` and
`busy_floor.md` to `--out`.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402,F401

import torchbridge as tb  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks import runners  # noqa: E402
from benchmarks import scripted_native  # noqa: E402
from benchmarks import step_breakdown  # noqa: E402
from benchmarks import td3_process  # noqa: E402
from torchbridge._runtime import _omp_team  # noqa: E402

sys.path.insert(0, os.path.join(harness.ROOT, "examples"))
from td3 import agents  # noqa: E402  pylint: disable=wrong-import-position

RUNNER = runners.RUN_TORCH
PYTHON_PATH = runners.RUN_TORCH_PY
FLOOR = "floor: bare ops, each callback instant"
SPIN = "floor, each callback spinning as long (a long op, nothing else)"
MEMORY = "floor, each callback writing over 4 MiB as long (a long op, the caches evicted)"
MATMULS = "floor, each callback running torch matmuls as long (torch's work, its threads)"
KINDS = {
  SPIN: scripted_native.NoPythonFloorModule.SPIN,
  MEMORY: scripted_native.NoPythonFloorModule.MEMORY,
  MATMULS: scripted_native.NoPythonFloorModule.TORCH_MATMULS,
}
TORCH = runners.TORCH_ACTOR_ONLY
TORCH_COMPUTE = "the same, its forwards and backwards only (no optimizer, no target update)"
NAMES = (RUNNER, FLOOR, SPIN, MEMORY, MATMULS, PYTHON_PATH, TORCH, TORCH_COMPUTE)
RECORDED = NAMES[:5]
# Idle before each block: the torch thread's OpenMP team released.
IDLE_S = 0.02
# The recorded rows, as step_breakdown names them.
TF_SIDE = step_breakdown.TF_SIDE
CALLBACKS = step_breakdown.SCRIPTED_CALLBACK
HAND_OFF = step_breakdown.BRIDGE["torchbridge/torch thread"]


def _steps():
  """{name: a train step} and the floor's modules."""
  runner = runners._td3_step(RUNNER)  # pylint: disable=protected-access
  agent = td3_process.bare_native_agent(kind="no-python-floor")
  floor = runners.td3_step_on_batches(agent, as_tf=True)
  modules = (agent.actor, agent.critic, agent.actor_target, agent.critic_target)
  steps = {
    RUNNER: runner,
    FLOOR: floor,
    PYTHON_PATH: runners._td3_step(PYTHON_PATH),  # pylint: disable=protected-access
    TORCH: runners._td3_step(TORCH),  # pylint: disable=protected-access
  }
  compute = agents.TorchAgent(3, 1, 2.0, 0, agents.Hyper())
  runners._actor_only(compute, updates=False)  # pylint: disable=protected-access
  steps[TORCH_COMPUTE] = runners.td3_step_on_batches(compute, as_tf=False)
  steps.update({name: floor for name in KINDS})
  return steps, modules


def _busy(modules, ns, kind):
  """Sets the floor's callbacks' work; returns how many have run."""
  return sum(m.busy(ns, kind) for m in modules)


def _recorded_block(step, steps, marks, events):
  with tb.timeline(annotate=False) as trace:
    step()  # outside every mark
    for _ in range(steps):
      marks.append(step_breakdown._timed(step, []))  # pylint: disable=protected-access
  events.extend(trace.events)


def _callback_spans(events, marks):
  """The durations (ns) of the C++ callbacks inside the steps `marks`."""
  spans = [e for e in events if e["name"] == "torchbridge/C++ callback"]
  return [
    e["end_ns"] - e["begin_ns"]
    for e in spans
    if any(begin <= e["begin_ns"] and e["end_ns"] <= end for begin, end in marks)
  ]


def _floor_callbacks_per_step(steps, modules, count):
  steps[FLOOR]()
  before = _busy(modules, 0, 0)
  for _ in range(count):
    steps[FLOOR]()
  return (_busy(modules, 0, 0) - before) / count


def one_process(rounds, steps_per_block, threads):
  """This process's record: every contender's step (and the recorded ones'
  rows), `rounds` rounds of alternated blocks. Each round, the floors'
  callbacks work the mean of the runner's callbacks recorded so far (first,
  in a block after a warm-up one)."""
  harness.configure_threads(threads)
  steps, modules = _steps()
  calls_per_step = _floor_callbacks_per_step(steps, modules, steps_per_block)
  plain = {name: [] for name in NAMES}
  marks = {name: [] for name in RECORDED}
  events = {name: [] for name in RECORDED}
  for _ in range(steps_per_block):
    steps[RUNNER]()
  _recorded_block(steps[RUNNER], steps_per_block, marks[RUNNER], events[RUNNER])
  busy_ns = []
  for r in range(rounds):
    spans = _callback_spans(events[RUNNER], marks[RUNNER])
    if not spans:
      raise RuntimeError(
        "no C++ callback span in the runner's steps: its calls took the Python path (unset "
        "TORCHBRIDGE_TORCH_RUNNER, and see `python -m torchbridge info`)"
      )
    busy_ns.append(int(sum(spans) / len(spans)))
    for name in NAMES[r % len(NAMES) :] + NAMES[: r % len(NAMES)]:
      _busy(modules, busy_ns[-1] if name in KINDS else 0, KINDS.get(name, 0))
      step = steps[name]
      time.sleep(IDLE_S)
      step()
      for _ in range(steps_per_block):
        step_breakdown._timed(step, plain[name])  # pylint: disable=protected-access
      if name not in RECORDED:
        _omp_team.release_this_threads_team()
      else:
        _recorded_block(step, steps_per_block, marks[name], events[name])
  _busy(modules, 0, 0)
  runner_calls = len(_callback_spans(events[RUNNER], marks[RUNNER])) / len(marks[RUNNER])
  contenders = {
    name: {"step_ms": step_breakdown._trimmed_mean(plain[name])}  # pylint: disable=protected-access
    for name in NAMES
    if name not in RECORDED
  }
  for name in RECORDED:
    contenders[name] = {
      "step_ms": step_breakdown._trimmed_mean(plain[name]),  # pylint: disable=protected-access
      "recorded_ms": step_breakdown._trimmed_mean(  # pylint: disable=protected-access
        [(end - begin) / 1e6 for begin, end in marks[name]]
      ),
      "rows_ms": step_breakdown._scripted_rows(events[name], marks[name]),  # pylint: disable=protected-access
    }
  return {
    "environment": harness.environment(threads, "cpu"),
    "torch": torch.__version__,
    "rounds": rounds,
    "steps_per_block": steps_per_block,
    "busy_ns": busy_ns,
    "callbacks_per_step": calls_per_step,
    "runner_callbacks_per_step": runner_calls,
    "contenders": contenders,
  }


def combine(records):
  """One venv's processes: each figure the median over them."""

  def median(values):
    return float(np.median(values))

  contenders = {}
  for name in NAMES:
    runs = [r["contenders"][name] for r in records]
    contenders[name] = {"step_ms": median([run["step_ms"] for run in runs])}
    if name in RECORDED:
      contenders[name]["recorded_ms"] = median([run["recorded_ms"] for run in runs])
      rows = sorted({row for run in runs for row in run["rows_ms"]})
      contenders[name]["rows_ms"] = {
        row: median([run["rows_ms"].get(row, 0.0) for run in runs]) for row in rows
      }
  return {
    "torch": records[0]["torch"],
    "busy_ns": [ns for r in records for ns in r["busy_ns"]],
    "callbacks_per_step": median([r["callbacks_per_step"] for r in records]),
    "runner_callbacks_per_step": median([r["runner_callbacks_per_step"] for r in records]),
    "contenders": contenders,
    "processes": records,
  }


def measure(pythons, processes, rounds, steps_per_block, threads, log=print):
  """{python: combine() of its processes}: `processes` rounds, each
  starting one process of each venv, the order rotating."""
  with harness.benchmarks_only_path() as path:

    def job(python):
      args = ["--one", "--rounds", rounds, "--steps", steps_per_block, "--threads", threads]
      return lambda: harness.run_process("benchmarks.busy_floor", args, python=python, path=path)

    runs = harness.alternated(
      {python: job(python) for python in pythons},
      rounds=processes,
      log=lambda m: log(f"  busy_floor {m}"),
    )
  return {python: combine(records) for python, records in runs.items()}


def markdown(data):
  """The committed tables: one for each venv."""
  lines = [
    f"Measured at {data['source']['commit'][:10]}: the TD3 train step (batch 256, "
    f"`benchmarks.runners`' batches); {data['processes']} processes a venv, alternated, each "
    f"{data['rounds']} rounds of alternated blocks of {data['steps_per_block']} steps (the "
    f"order rotating); each figure a process's mean of the middle 80% of its steps, the "
    f"median over the processes; {data['threads']} threads.",
    "",
  ]
  for python, result in data["venvs"].items():
    lines += [f"**{runners.venv_name(python)}** (torch {result['torch']}):", ""]
    lines += _venv_table(result)
  return "\n".join(lines)


def _venv_table(result):
  c = result["contenders"]
  floor_tf = c[FLOOR]["rows_ms"][TF_SIDE]
  busy = result["busy_ns"]
  lines = [
    f"| TD3 train step | ms | / {TORCH} | recorded, ms | TF's side, ms "
    "| over the floor's, ms | callbacks, ms | hand-off, ms |",
    "|---|---|---|---|---|---|---|---|",
  ]
  reference = c[TORCH]["step_ms"]
  for name in NAMES:
    step = c[name]["step_ms"]
    row = f"| {name} | {step:.2f} | {step / reference:.2f}x |"
    if name not in RECORDED:
      lines.append(row + " | | | | |")
      continue
    rows = c[name]["rows_ms"]
    lines.append(
      row + f" {c[name]['recorded_ms']:.2f} | {rows[TF_SIDE]:.2f} | "
      f"{rows[TF_SIDE] - floor_tf:+.2f} | {rows.get(CALLBACKS, 0.0):.2f} | "
      f"{rows.get(HAND_OFF, 0.0):.2f} |"
    )
  over = {name: c[name]["rows_ms"][TF_SIDE] - floor_tf for name in (RUNNER, SPIN, MEMORY, MATMULS)}
  lines += [
    "",
    f"The floors' callbacks worked {min(busy) / 1e3:.0f}-{max(busy) / 1e3:.0f} us each (each "
    f"round, the runner's callbacks' mean so far in its process), "
    f"{result['callbacks_per_step']:.1f} callbacks a step (the runner's: "
    f"{result['runner_callbacks_per_step']:.1f}). TF's side over the floor's: the runner's "
    f"{over[RUNNER]:+.2f} ms a step; with the callbacks' time put back and no torch in them, "
    f"spinning {over[SPIN]:+.2f} ms and writing over memory {over[MEMORY]:+.2f} ms; with "
    f"torch's matmuls in them {over[MATMULS]:+.2f} ms. The runner's step less the floor with "
    f"torch's matmuls put back: {c[RUNNER]['step_ms'] - c[MATMULS]['step_ms']:+.2f} ms. The "
    f"runner's callbacks (torch's work in the call, DLPack in and out) against pure torch's "
    f"forwards and backwards: {c[RUNNER]['rows_ms'][CALLBACKS]:.2f} ms against "
    f"{c[TORCH_COMPUTE]['step_ms']:.2f} ms a step. Pure torch's optimizers and target "
    f"updates (its step less its forwards and backwards): "
    f"{c[TORCH]['step_ms'] - c[TORCH_COMPUTE]['step_ms']:.2f} ms a step, against TF's side "
    f"of the floor's step, {floor_tf:.2f} ms.",
    "",
  ]
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.busy_floor", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("--python", action="append", help="a venv's python (repeatable)")
  parser.add_argument("--processes", type=int, default=3, help="processes a venv")
  parser.add_argument("--rounds", type=int, default=12, help="rounds a process")
  parser.add_argument("--steps", type=int, default=20, help="steps a block")
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--one", action="store_true", help="this process only; prints its JSON")
  parser.add_argument("--out", default="benchmarks/results")
  args = parser.parse_args(argv)
  if args.one:
    why = scripted_native.unavailable()
    if why:
      print(f"the C++ torch runner's floor cannot run here: {why}", file=sys.stderr)
      return 1
    print(json.dumps(one_process(args.rounds, args.steps, args.threads)))
    return 0
  pythons = [os.path.abspath(p) for p in (args.python or [sys.executable])]
  data = {
    "source": harness.environment(args.threads, "cpu")["source"],
    "processes": args.processes,
    "rounds": args.rounds,
    "steps_per_block": args.steps,
    "threads": args.threads,
    "venvs": measure(pythons, args.processes, args.rounds, args.steps, args.threads),
  }
  harness.write_results(args.out, "busy_floor", data, markdown(data))
  return 0


if __name__ == "__main__":
  sys.exit(main())
