"""The TD3 script's wall time, split, for each backend side by side.

`python -m benchmarks.td3_wall [--rounds R] [--steps N] [--out DIR]` runs
examples/td3_pendulum.py (N environment steps, the first 1,000 random) once
per backend per round, each run a process of its own, the backends'
order rotating from round to round (`benchmarks.td3_process`). Each run's
wall time is split into parts that add up to it: the first policy call and
the first train step (where the TF backends trace their `tf.function`s),
the other policy calls (one per environment step, through `tf.function` for
the TF backends, plus the final evaluation's), the other train steps, and
the rest (environment, replay buffer, summaries, building the agent, the
checkpoint), and the process's start (the imports) and exit. Writes td3_wall.json and td3_wall.md (medians over the rounds,
each part's median on its own, so the parts' medians need not add up to
the wall time's median exactly). The wall time is the whole process's, as a
user running the script waits for it: Python's start and the imports
included.

The `floor` column is the torchbridge run with its four modules bare
native ops that hand back fresh torch tensors (`td3_process`'s
`floor-script`): the same script, `tf.function`s, Keras Adam and
crossings, no torch compute and no bridge Python. That process then times
torch's own compute for one policy call and one train step; the floor's
wall time plus that compute for the run's calls is what no bridge can go
below (`floor_plus_torch_s`), and the torchbridge run's wall time minus it
is the bridge's share (`bridge_share_s`). The `lean bridge` column runs the
torch modules on the same ops through the leanest Python bridge one can
write (`bare_native.LeanTorchModule`): how much of that share is
torchbridge's own. The `no-Python bridge` column runs them as
a torch.export capture, from the ops' kernel in C++ (`scripted_native.ScriptedTorchModule`):
how much of the share is Python per call, the modules' own Python
included. The `torchbridge, run="torch"` column is the torchbridge
run with `--run torch`: its modules' graph calls on the C++ torch runner.
"""

import argparse
import itertools
import json
import os
import tempfile

import numpy as np

from benchmarks import harness
from benchmarks import scripted_native

FLOOR = "floor"
LEAN = "lean bridge"
SCRIPTED = "no-Python bridge"
TORCH_RUNNER = 'torchbridge, run="torch" (C++ torch runner)'
BACKENDS = {
  "torchbridge": "torchbridge",
  "pure torch": "torch",
  "keras": "tf",
  FLOOR: "floor-script",
  LEAN: "lean-script",
  SCRIPTED: "scripted-script",
  TORCH_RUNNER: "torchbridge-torch",
}
# The script's parts (`td3_process.wall_split`), then the process's own.
SCRIPT_PARTS = ("first policy call", "first train step", "policy calls", "train steps", "the rest")
PROCESS_START = "Python's start, the imports, the exit"
PARTS = (PROCESS_START, *SCRIPT_PARTS)


def run_script_process(backend, out, steps, threads, **run_options):
  """One `benchmarks.td3_process` run of the script for `backend` (its run
  directory `out`): `steps` environment steps, the first third random (at
  most 1,000). `run_options` go to `harness.run_process`."""
  return harness.run_process(
    "benchmarks.td3_process",
    [
      backend,
      "--steps",
      steps,
      "--start-steps",
      min(1000, steps // 3),
      "--threads",
      threads,
      "--out",
      out,
    ],
    **run_options,
  )


def measure(rounds, steps, threads, log=print):
  """{backend: {"wall_s", each part, "policy_call_median_us",
  "ms_per_train_step": medians over the rounds; "processes": records}}."""
  runs_started = itertools.count()
  with tempfile.TemporaryDirectory(prefix="td3_wall_") as tmp:

    def job(backend):
      # A fresh run directory per run: in one used before, the script would
      # resume from the last run's final checkpoint and train no step.
      return lambda: run_script_process(
        backend, os.path.join(tmp, f"{next(runs_started)}_{backend}", "run"), steps, threads
      )

    backends = dict(BACKENDS)
    why_not = scripted_native.unavailable()  # builds its C++ callbacks once, here
    if why_not:
      log(f"  td3 wall time: no no-Python bridge column: {why_not}")
      del backends[SCRIPTED]
    runs = harness.alternated(
      {name: job(backend) for name, backend in backends.items()},
      rounds=rounds,
      log=lambda m: log(f"  td3 wall time {m}"),
    )
  return summarize(runs)


def summarize(runs):
  """{backend: medians of its process records `runs[backend]`, and the
  records}; the floor's also the figures of what no bridge goes below."""
  result = {}
  for name, records in runs.items():
    summary = {
      key: float(np.median([_wall(r) if key == "wall_s" else r[key] for r in records]))
      for key in ("wall_s", "policy_call_median_us", "ms_per_train_step")
    }
    for part in PARTS:
      summary[part] = float(np.median([_parts(r)[part] for r in records]))
    summary["processes"] = records
    result[name] = summary
  floor = result[FLOOR]
  floor["floor_plus_torch_s"] = float(np.median([_floor_plus_torch(r) for r in runs[FLOOR]]))
  for key in ("policy_call_us", "train_step_ms"):
    floor[f"torch_{key}"] = float(np.median([r["torch_compute"][key] for r in runs[FLOOR]]))
  floor["bridge_share_s"] = result["torchbridge"]["wall_s"] - floor["floor_plus_torch_s"]
  return result


def _wall(record):
  """The process's wall time, less the floor's timing of torch's compute
  after the script."""
  return record["wall_s"] - record.get("torch_compute_s", 0.0)


def _parts(record):
  """A run's parts, adding up to `_wall(record)`."""
  return {PROCESS_START: _wall(record) - record["script_wall_s"], **record["wall_split"]}


def _floor_plus_torch(record):
  """A floor run's wall time plus torch's compute for its calls (seconds):
  what a bridged run of the same calls cannot go below."""
  compute = record["torch_compute"]
  return (
    _wall(record)
    + 1e-6 * compute["policy_call_us"] * record["policy_calls"]
    + 1e-3 * compute["train_step_ms"] * record["train_steps"]
  )


def markdown(result, rounds, steps):
  names = list(result)
  floor, torch_s = result[FLOOR], result["pure torch"]["wall_s"]
  lines = [
    f"TD3 script wall time, seconds ({steps:,} environment steps; median of "
    f"{rounds} alternated rounds, a process per run)",
    "",
    "| part | " + " | ".join(names) + " | torchbridge - pure torch |",
    "|---|" + "---|" * (len(names) + 1),
  ]
  for part in ("wall_s", *PARTS):
    label = "**whole run**" if part == "wall_s" else part
    values = [result[n][part] for n in names]
    gap = result["torchbridge"][part] - result["pure torch"][part]
    lines.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {gap:+.2f} |")
  lines += [
    "",
    "| per call | " + " | ".join(names) + " |",
    "|---|" + "---|" * len(names),
    "| policy call, us (median) | "
    + " | ".join(f"{result[n]['policy_call_median_us']:.0f}" for n in names)
    + " |",
    "| train step, ms (mean after the first 10) | "
    + " | ".join(f"{result[n]['ms_per_train_step']:.2f}" for n in names)
    + " |",
    "",
    "whole run, torchbridge / pure torch: "
    f"{result['torchbridge']['wall_s'] / torch_s:.2f}x; "
    f"keras / pure torch: {result['keras']['wall_s'] / torch_s:.2f}x",
    "",
    f"What no bridge can go below: the floor's run ({floor['wall_s']:.2f} s: bare native "
    "ops handing back fresh torch tensors, no torch compute, no bridge Python) plus "
    f"torch's compute for the run's calls ({floor['torch_policy_call_us']:.0f} us a policy "
    f"call, {floor['torch_train_step_ms']:.2f} ms a train step, timed on the modules in the "
    f"floor's process): {floor['floor_plus_torch_s']:.2f} s, "
    f"{floor['floor_plus_torch_s'] / torch_s:.2f}x pure torch's run. "
    f"The bridge's share of the torchbridge run: {floor['bridge_share_s']:.2f} s "
    f"({floor['bridge_share_s'] / result['torchbridge']['wall_s']:.0%}).",
  ]
  others = {
    LEAN: "The same run through the leanest Python bridge on the same ops "
    "(`bare_native.LeanTorchModule`: none of torchbridge's Python)",
    TORCH_RUNNER: 'torchbridge with `run="torch"` (its graph calls on the C++ torch runner)',
    SCRIPTED: "The same run with no Python per call (`scripted_native.ScriptedTorchModule`: "
    "the modules captured with torch.export and run from the ops' kernel in C++; "
    "its tracing included)",
  }
  for column, label in others.items():
    if column not in result:
      continue
    wall_s, step_ms = result[column]["wall_s"], result[column]["ms_per_train_step"]
    lines += [
      "",
      f"{label}: {wall_s:.2f} s, {wall_s / torch_s:.2f}x pure torch's; its train steps "
      f"{step_ms:.2f} ms, {step_ms / result['pure torch']['ms_per_train_step']:.2f}x; "
      f"torchbridge {result['torchbridge']['wall_s'] / wall_s:.2f}x it.",
    ]
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.td3_wall", description=__doc__)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = parser.parse_args(argv)
  result = measure(args.rounds, args.steps, args.threads)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "td3_wall.json"), "w") as f:
    json.dump({"rounds": args.rounds, "steps": args.steps, "backends": result}, f, indent=1)
  text = markdown(result, args.rounds, args.steps)
  with open(os.path.join(args.out, "td3_wall.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
