"""The TD3 train step and script of `make demo` in several venvs, side by side.

`python -m benchmarks.td3_venvs --python A --python B [--rounds R] [--steps N]`
runs examples/td3_pendulum.py (N environment steps, the first third
random, at most 1,000) through `benchmarks.td3_process` for the
torchbridge backend (its default runner and, with `run="torch"`, the C++
torch runner: no Python per call), the pure-torch backend and
the leanest Python bridge on the same native op, in each venv, each run a process of its own, the
(venv, backend) pairs' order rotating from round to round. Each process
imports torch, TensorFlow and torchbridge from its venv (`-P`, with only
benchmarks/ and examples/ on its path), as `benchmarks.per_call_venvs`
does: `make bench-user` passes the development venv's Python and the
user-install venv's (`make test-user`'s: torch from the package index,
with triton), so the issue's targets are measured on the op users get too.
Writes td3_venvs.json and td3_venvs.md (medians over the rounds).
"""

import argparse
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks import td3_wall

BACKENDS = {
  "torchbridge": "torchbridge",
  "pure torch": "torch",
  "lean bridge": "lean-script",
  'run="torch"': "torchbridge-torch",
}


def measure(pythons, rounds, steps, threads, log=print):
  """{python: {backend: {"ms_per_train_step", "wall_s", "policy_call_median_us":
  medians over the rounds, "processes": records}}}."""
  runs_started = itertools.count()
  with tempfile.TemporaryDirectory(prefix="td3_venvs_") as tmp:
    path = os.path.join(tmp, "path")
    os.mkdir(path)
    # Only benchmarks/ and examples/ on the path: the rest comes from the venv.
    for name in ("benchmarks", "examples"):
      os.symlink(os.path.join(harness.ROOT, name), os.path.join(path, name))

    def job(python, backend):
      # A fresh run directory per run (see td3_wall.measure).
      return lambda: td3_wall.run_script_process(
        backend,
        os.path.join(tmp, f"{next(runs_started)}_{backend}", "run"),
        steps,
        threads,
        python=python,
        path=path,
      )

    jobs = {
      (python, name): job(python, backend)
      for python in pythons
      for name, backend in BACKENDS.items()
    }
    runs = harness.alternated(jobs, rounds=rounds, log=lambda m: log(f"  td3 in venvs {m}"))
  result = {}
  for (python, name), records in runs.items():
    result.setdefault(python, {})[name] = {
      key: float(np.median([r[key] for r in records]))
      for key in ("ms_per_train_step", "wall_s", "policy_call_median_us")
    } | {
      "torch": records[0]["torch"],
      "torchbridge_file": records[0]["torchbridge_file"],
      "native_op_complete": all(r["native_op_complete"] for r in records),
      "processes": records,
    }
  return result


def markdown(result, rounds, steps):
  venvs = list(result)
  head = " | ".join(
    f"torch {result[v]['torchbridge']['torch']} "
    f"({'complete op' if result[v]['torchbridge']['native_op_complete'] else 'FALLBACK op'})"
    for v in venvs
  )
  lines = [
    f"TD3 in each venv ({steps:,} environment steps; median of {rounds} alternated "
    "rounds, a process per run)",
    "",
    f"| | {head} |",
    "|---|" + "---|" * len(venvs),
  ]
  rows = (
    ("train step, ms: torchbridge", "torchbridge", "ms_per_train_step"),
    ("train step, ms: pure torch", "pure torch", "ms_per_train_step"),
    ("train step, ms: leanest Python bridge", "lean bridge", "ms_per_train_step"),
    ('train step, ms: torchbridge, run="torch"', 'run="torch"', "ms_per_train_step"),
    ("whole run, s: torchbridge", "torchbridge", "wall_s"),
    ("whole run, s: pure torch", "pure torch", "wall_s"),
    ("whole run, s: leanest Python bridge", "lean bridge", "wall_s"),
    ('whole run, s: torchbridge, run="torch"', 'run="torch"', "wall_s"),
  )

  def measured(*backends):
    return all(b in result[v] for v in venvs for b in backends)

  for label, backend, key in (r for r in rows if measured(r[1])):
    lines.append(
      f"| {label} | " + " | ".join(f"{result[v][backend][key]:.2f}" for v in venvs) + " |"
    )
  ratios = (
    (
      "train step: torchbridge / pure torch (target 1.10)",
      "torchbridge",
      "pure torch",
      "ms_per_train_step",
    ),
    (
      "train step: leanest Python bridge / pure torch",
      "lean bridge",
      "pure torch",
      "ms_per_train_step",
    ),
    (
      "train step: torchbridge / leanest Python bridge",
      "torchbridge",
      "lean bridge",
      "ms_per_train_step",
    ),
    (
      'train step: torchbridge, run="torch" / pure torch (target 1.10)',
      'run="torch"',
      "pure torch",
      "ms_per_train_step",
    ),
    ("whole run: torchbridge / pure torch (target 1.2)", "torchbridge", "pure torch", "wall_s"),
    ("whole run: leanest Python bridge / pure torch", "lean bridge", "pure torch", "wall_s"),
    (
      'whole run: torchbridge, run="torch" / pure torch (target 1.2)',
      'run="torch"',
      "pure torch",
      "wall_s",
    ),
  )
  for label, a, b, key in (r for r in ratios if measured(r[1], r[2])):
    lines.append(
      f"| {label} | "
      + " | ".join(f"{result[v][a][key] / result[v][b][key]:.2f}x" for v in venvs)
      + " |"
    )
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.td3_venvs", description=__doc__)
  parser.add_argument("--python", action="append", required=True)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--out", default=str(Path(harness.ROOT) / "benchmarks" / "results"))
  args = parser.parse_args(argv)
  # Absolute, not resolved: a venv's python is a symlink to the base one.
  pythons = [os.path.abspath(p) for p in args.python]
  result = measure(pythons, args.rounds, args.steps, args.threads)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "td3_venvs.json").write_text(
    json.dumps({"rounds": args.rounds, "steps": args.steps, "venvs": result}, indent=1) + "\n"
  )
  text = markdown(result, args.rounds, args.steps)
  (out / "td3_venvs.md").write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
