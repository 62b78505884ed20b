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
"""

import argparse
import itertools
import json
import os
import tempfile

import numpy as np

from benchmarks import harness

BACKENDS = {"torchbridge": "torchbridge", "pure torch": "torch", "keras": "tf"}
# The script's parts (`td3_process.wall_split`), then the process's own.
SCRIPT_PARTS = ("first policy call", "first train step", "policy calls", "train steps", "the rest")
PROCESS_START = "Python's start, the imports, the exit"
PARTS = (PROCESS_START, *SCRIPT_PARTS)


def measure(rounds, steps, threads, log=print):
  """{backend: {"wall_s", each part, "policy_call_median_us",
  "ms_per_train_step": medians over the rounds; "processes": records}}."""
  runs_started = itertools.count()
  with tempfile.TemporaryDirectory(prefix="td3_wall_") as tmp:

    def job(backend):
      return lambda: harness.run_process(
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
          os.path.join(tmp, f"{next(runs_started)}_{backend}", "run"),
        ],
      )

    runs = harness.alternated(
      {name: job(backend) for name, backend in BACKENDS.items()},
      rounds=rounds,
      log=lambda m: log(f"  td3 wall time {m}"),
    )
  result = {}
  for name, records in runs.items():
    summary = {
      key: float(np.median([r[key] for r in records]))
      for key in ("wall_s", "policy_call_median_us", "ms_per_train_step")
    }
    for part in PARTS:
      summary[part] = float(np.median([_parts(r)[part] for r in records]))
    summary["processes"] = records
    result[name] = summary
  return result


def _parts(record):
  """A run's parts, adding up to its process's wall time."""
  return {PROCESS_START: record["wall_s"] - record["script_wall_s"], **record["wall_split"]}


def markdown(result, rounds, steps):
  names = list(result)
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
    f"{result['torchbridge']['wall_s'] / result['pure torch']['wall_s']:.2f}x; "
    f"keras / pure torch: {result['keras']['wall_s'] / result['pure torch']['wall_s']:.2f}x",
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
