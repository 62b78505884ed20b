"""Under load: the same step quiet and beside busy processes, side by side.

Usage:
  python -m benchmarks.load [--rounds 2] [--out benchmarks/results]

Each contender of `benchmarks/load_process.py` (Keras, the bridge on each
runner, pure torch) times one Adam step of the 3-256-256-1 MLP on a batch
of 64 in a process of its own, under each condition:

- quiet: nothing else running (waits for a quiet machine first);
- busy1 / busy2: beside 1 / 2 processes that spin a core each, all at the
  same niceness;
- nice19 busy1 / nice19 busy2: the same, the timed process at niceness 19
  (taken after its set-up), as a background job beside other work.

The eager policy call (a [1, 3] state, read as numpy) is timed quiet and
beside one busy process. The torch thread's hand-off is timed with each
spin setting (`TORCHBRIDGE_TORCH_THREAD_SPIN`: adaptive, the default;
always; never) on the torch runners, quiet and loaded. Rounds alternate the
order. Writes `results/load.json` (with the commit) and `results/load.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

import numpy as np

from benchmarks import harness
from benchmarks import load_process as lp

# name -> (busy processes, niceness of the timed process)
CONDITIONS = {
  "quiet": (0, 0),
  "busy1": (1, 0),
  "busy2": (2, 0),
  "nice19 busy1": (1, 19),
  "nice19 busy2": (2, 19),
}
SPINS = ("adaptive", "always", "never")
# What a pure-torch user can do beside other work (the threads guide):
# name -> (extra environment, load_process arguments).
REMEDIES = {
  "as is (2 threads)": ({}, []),
  "OMP_WAIT_POLICY=PASSIVE": ({"OMP_WAIT_POLICY": "PASSIVE"}, []),
  "torch.set_num_threads(1)": ({}, ["--threads", "1"]),
}
TORCH_RUNNERS = (lp.BRIDGE_CPP, lp.BRIDGE_PY)


@contextlib.contextmanager
def busy(count):
  """`count` processes that each spin a core, at niceness 0."""
  procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
  try:
    time.sleep(0.2 if procs else 0)
    yield
  finally:
    for proc in procs:
      proc.kill()
      proc.wait()


@contextlib.contextmanager
def environ(**values):
  """`os.environ` with `values` set, restored after."""
  previous = {name: os.environ.get(name) for name in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for name, value in previous.items():
      if value is None:
        del os.environ[name]
      else:
        os.environ[name] = value


def _job(contender, what, condition, spin, remedy=None, timeline=False):
  count, nice = CONDITIONS[condition]
  extra_env, extra_args = REMEDIES[remedy] if remedy else ({}, [])
  if timeline:
    extra_args = [*extra_args, "--timeline"]

  def run():
    if count == 0:
      harness.wait_for_quiet()
    with environ(TORCHBRIDGE_TORCH_THREAD_SPIN=spin, **extra_env), busy(count):
      record = harness.run_process(
        "benchmarks.load_process",
        [contender, what, "--nice", nice, *extra_args],
        quiet_wait=0,
      )
    record.update(condition=condition, spin=spin, remedy=remedy)
    return record

  return run


def jobs():
  """{(what, contender, condition, spin): job} of one round."""
  out = {}
  for contender in lp.CONTENDERS:
    for condition in CONDITIONS:
      out[("step", contender, condition, "adaptive")] = _job(
        contender, "step", condition, "adaptive"
      )
    for condition in ("quiet", "busy1"):
      out[("eager", contender, condition, "adaptive")] = _job(
        contender, "eager", condition, "adaptive"
      )
  for contender in TORCH_RUNNERS:
    for spin in SPINS[1:]:
      for condition in ("quiet", "busy1", "nice19 busy1"):
        out[("step", contender, condition, spin)] = _job(contender, "step", condition, spin)
  return out


def remedy_jobs():
  """{("step", pure torch, condition, remedy): job}: pure torch's step as
  is and with each remedy, quiet and beside one and two busy processes."""
  return {
    ("step", lp.PURE_TORCH, condition, remedy): _job(
      lp.PURE_TORCH, "step", condition, "adaptive", remedy
    )
    for remedy in REMEDIES
    for condition in ("quiet", "busy1", "busy2")
  }


def markdown_remedies(data):
  env = data["environment"]
  commit = (env["source"]["commit"] or "?")[:7]
  lines = [
    f"Pure torch's Adam step of the 3-256-256-1 MLP (batch 64) beside busy processes, "
    f"at {commit}: torch {env['torch']}, {env['cpu_count']} cores, {data['rounds']} "
    "rounds, ms (in brackets: the ratio to the same setting's quiet step).",
    "",
    "| setting | quiet | busy1 | busy2 |",
    "|---|---|---|---|",
  ]
  by_key = {(r["remedy"], r["condition"]): r["median_us"] for r in data["results"]}
  for remedy in REMEDIES:
    quiet = by_key[(remedy, "quiet")]
    cells = [
      f"{by_key[(remedy, c)] / 1e3:.2f} ({by_key[(remedy, c)] / quiet:.1f}x)"
      for c in ("quiet", "busy1", "busy2")
    ]
    lines.append(f"| {remedy} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


BREAKDOWN_CONDITIONS = ("quiet", "busy1", "nice19 busy1")
# The native op's phases (csrc/timeline.cc) a step's torch-runner calls pass.
KERNEL, CALLBACK = "torchbridge/kernel", "torchbridge/C++ callback"


def breakdown_jobs():
  """The C++ torch runner's step with its phases recorded, and Keras' and
  the TF runner's step again (more rounds: the ratios the issue asks)."""
  out = {
    ("step", lp.BRIDGE_CPP, condition, "timeline"): _job(
      lp.BRIDGE_CPP, "step", condition, "adaptive", timeline=True
    )
    for condition in BREAKDOWN_CONDITIONS
  }
  for contender in (lp.KERAS, lp.BRIDGE):
    for condition in ("quiet", "busy1", "busy2", "nice19 busy1"):
      out[("step", contender, condition, "again")] = _job(contender, "step", condition, "adaptive")
  return out


def markdown_breakdown(data):
  env = data["environment"]
  commit = (env["source"]["commit"] or "?")[:7]
  lines = [
    f"At {commit}: torch {env['torch']}, TF {env['tensorflow']}, {env['cpu_count']} cores, "
    f"{data['rounds']} rounds.",
    "",
    "**Where a torch-runner step goes** (the C++ runner's step with `tb.timeline()` "
    "recording, each process's mean over its timed steps, then the median process; us "
    "per step): the torch code of its calls (forward and backward, run from C++ on the "
    "torch thread), the rest of its calls (the hand-off and the crossings), and the "
    "step's TF part (the step's time less its calls).",
    "",
    "| condition | step | torch code | hand-off and crossings | TF part |",
    "|---|---|---|---|---|",
  ]
  for condition in BREAKDOWN_CONDITIONS:
    [r] = [r for r in data["results"] if r["kind"] == "timeline" and r["condition"] == condition]
    procs = sorted(r["processes"], key=lambda p: p["mean_us"])
    p = procs[len(procs) // 2]
    phases = p["phases_us_per_step"]
    kernel, callback = phases.get(KERNEL, 0.0), phases.get(CALLBACK, 0.0)
    lines.append(
      f"| {condition} | {p['mean_us']:.0f} | {callback:.0f} | {kernel - callback:.0f} | "
      f"{p['mean_us'] - kernel:.0f} |"
    )
  lines += [
    "",
    "**Keras and the default runner again** (ms; in brackets: the ratio to the same "
    "contender's quiet step; the last column: the default runner's ratio over Keras' "
    "ratio):",
    "",
    "| condition | Keras | torchbridge (default: TF runner) | ratio over Keras' |",
    "|---|---|---|---|",
  ]
  again = {
    (r["contender"], r["condition"]): r["median_us"]
    for r in data["results"]
    if r["kind"] == "again"
  }
  for condition in ("quiet", "busy1", "busy2", "nice19 busy1"):
    k = again[(lp.KERAS, condition)] / again[(lp.KERAS, "quiet")]
    b = again[(lp.BRIDGE, condition)] / again[(lp.BRIDGE, "quiet")]
    lines.append(
      f"| {condition} | {again[(lp.KERAS, condition)] / 1e3:.2f} ({k:.2f}x) | "
      f"{again[(lp.BRIDGE, condition)] / 1e3:.2f} ({b:.2f}x) | {b / k:.2f} |"
    )
  return "\n".join(lines) + "\n"


def measure(job_table, fields, rounds, log=print):
  """Runs `job_table` ({key: job}) for `rounds` alternated rounds; each
  result names its key's parts by `fields`, with the median, least and most
  of its processes' medians."""
  runs = harness.alternated(job_table, rounds=rounds, log=lambda m: log(f"  load {m}"))
  results = []
  for key, records in runs.items():
    medians = [r["median_us"] for r in records]
    results.append(
      {
        **dict(zip(fields, key)),
        "median_us": float(np.median(medians)),
        "min_us": float(min(medians)),
        "max_us": float(max(medians)),
        "processes": records,
      }
    )
  return {
    "environment": harness.environment(os.cpu_count() or 1, "cpu"),
    "rounds": rounds,
    "results": results,
    "failures": harness.FAILURES,
  }


def _lookup(data, what, contender, condition, spin="adaptive"):
  for r in data["results"]:
    if (r["what"], r["contender"], r["condition"], r["spin"]) == (
      what,
      contender,
      condition,
      spin,
    ):
      return r
  return None


def markdown(data):
  env = data["environment"]
  commit = (env["source"]["commit"] or "?")[:7]
  lines = [
    f"Under load, at {commit}: torch {env['torch']}, TF {env['tensorflow']}, "
    f"{env['cpu_count']} cores, {data['rounds']} rounds, each cell the median over "
    "processes of each process's median of 7 timed blocks of about 0.3 s.",
    "",
    "**One Adam step of the 3-256-256-1 MLP, batch 64** (ms; in brackets: the "
    "ratio to the same contender's quiet step):",
    "",
    "| contender | " + " | ".join(CONDITIONS) + " |",
    "|---|" + "---|" * len(CONDITIONS),
  ]
  for contender in lp.CONTENDERS:
    quiet = _lookup(data, "step", contender, "quiet")
    cells = []
    for condition in CONDITIONS:
      r = _lookup(data, "step", contender, condition)
      ratio = r["median_us"] / quiet["median_us"]
      cells.append(f"{r['median_us'] / 1e3:.2f} ({ratio:.2f}x)")
    lines.append(f"| {contender} | " + " | ".join(cells) + " |")
  lines += [
    "",
    "**The torch thread's hand-off** (`TORCHBRIDGE_TORCH_THREAD_SPIN`), the same "
    "step on the torch runners (ms):",
    "",
    "| contender | spin | quiet | busy1 | nice19 busy1 |",
    "|---|---|---|---|---|",
  ]
  for contender in TORCH_RUNNERS:
    for spin in SPINS:
      cells = [
        f"{_lookup(data, 'step', contender, c, spin)['median_us'] / 1e3:.2f}"
        for c in ("quiet", "busy1", "nice19 busy1")
      ]
      lines.append(f"| {contender} | {spin} | " + " | ".join(cells) + " |")
  lines += [
    "",
    "**One eager call on a [1, 3] state, read as numpy** (the policy call of each "
    "environment step; us):",
    "",
    "| contender | quiet | busy1 | vs Keras, quiet |",
    "|---|---|---|---|",
  ]
  keras_quiet = _lookup(data, "eager", lp.KERAS, "quiet")["median_us"]
  for contender in lp.CONTENDERS:
    quiet = _lookup(data, "eager", contender, "quiet")["median_us"]
    loaded = _lookup(data, "eager", contender, "busy1")["median_us"]
    lines.append(f"| {contender} | {quiet:.0f} | {loaded:.0f} | {quiet / keras_quiet:.2f}x |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument(
    "--breakdown",
    action="store_true",
    help="the torch runner's step by phase, Keras and the default runner again "
    "(results/load_breakdown.*)",
  )
  parser.add_argument(
    "--remedies",
    action="store_true",
    help="time pure torch's remedies instead (results/load_torch_remedies.*)",
  )
  parser.add_argument("--out", default=os.path.join(harness.ROOT, "benchmarks", "results"))
  args = parser.parse_args(argv)
  # Stopped by a signal, the busy processes go too (`busy`'s finally).
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
  if args.breakdown:
    data = measure(breakdown_jobs(), ("what", "contender", "condition", "kind"), args.rounds)
    harness.write_results(args.out, "load_breakdown", data, markdown_breakdown(data))
    return
  if args.remedies:
    data = measure(remedy_jobs(), ("what", "contender", "condition", "remedy"), args.rounds)
    harness.write_results(args.out, "load_torch_remedies", data, markdown_remedies(data))
    return
  data = measure(jobs(), ("what", "contender", "condition", "spin"), args.rounds)
  harness.write_results(args.out, "load", data, markdown(data))


if __name__ == "__main__":
  main()
