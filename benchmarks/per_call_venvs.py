"""Per-call figures of `make bench` in several venvs, side by side.

`python -m benchmarks.per_call_venvs --python A --python B [--rounds N]`
runs `benchmarks.per_call_process` once per venv per round, the order
alternating, each in a process of its own, and writes per_call_venvs.json
and .md to benchmarks/results/. `make bench-user` passes the development
venv's Python and the user-install venv's (`make test-user`'s: torch from
the package index, with triton), so the op a user gets is measured beside
the one CI tests. Each process imports the torchbridge its venv has
installed (`-P`, with only benchmarks/ added to its path): the package as
`pip install .` put it in the user venv, the editable checkout in the
development venv.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parent.parent
ROWS = (
  "tf.function identity",
  "native op doing nothing (in tf.function)",
  "native op, torch tensors handed back (in tf.function)",
  "torchbridge identity, native op (in tf.function)",
  "torchbridge identity, tf.py_function path (in tf.function)",
  "eager torchbridge identity",
)


def run_one(python, threads, path_dir):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=path_dir)
  env.pop("TORCHBRIDGE_DISABLE_NATIVE", None)
  out = subprocess.run(
    [python, "-P", "-m", "benchmarks.per_call_process", str(threads)],
    env=env,
    cwd=tempfile.gettempdir(),
    capture_output=True,
    text=True,
    timeout=1800,
    check=False,
  )
  if out.returncode != 0:
    raise RuntimeError(f"{python}: {out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.per_call_venvs", description=__doc__)
  parser.add_argument("--python", action="append", required=True)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--out", default=str(_ROOT / "benchmarks" / "results"))
  args = parser.parse_args(argv)
  # Absolute, not resolved: a venv's python is a symlink to the base one.
  args.python = [os.path.abspath(p) for p in args.python]
  runs = {python: [] for python in args.python}
  with tempfile.TemporaryDirectory(prefix="tb_bench_path_") as path_dir:
    # Only benchmarks/ on the path: torchbridge comes from the venv.
    os.symlink(_ROOT / "benchmarks", Path(path_dir, "benchmarks"))
    for r in range(args.rounds):
      order = args.python if r % 2 == 0 else list(reversed(args.python))
      for python in order:
        runs[python].append(run_one(python, args.threads, path_dir))
        print(f"round {r + 1}: {python}: torch {runs[python][-1]['torch']}", flush=True)
  venvs = []
  for python, records in runs.items():
    venvs.append(
      {
        "python": python,
        "torch": records[0]["torch"],
        "tensorflow": records[0]["tensorflow"],
        "torchbridge_file": records[0]["torchbridge_file"],
        "complete": all(r["complete"] for r in records),
        "status": records[0]["status"],
        "median_us": {
          name: float(np.median([r["overhead"][name] for r in records]))
          for name in records[0]["overhead"]
        },
        "processes": records,
      }
    )
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "per_call_venvs.json").write_text(
    json.dumps({"threads": args.threads, "rounds": args.rounds, "venvs": venvs}, indent=2) + "\n"
  )
  text = markdown(venvs, args.rounds)
  (out / "per_call_venvs.md").write_text(text)
  print(text)
  return 0


def markdown(venvs, rounds):
  head = " | ".join(
    f"torch {v['torch']} ({'complete op' if v['complete'] else 'FALLBACK op'})" for v in venvs
  )
  lines = [
    f"Per-call time, us (median over {rounds} processes per venv, "
    "alternated; each process's figure is a median of 15 timings)",
    "",
    f"| call | {head} |",
    "|---|" + "---|" * len(venvs),
  ]
  for row in ROWS:
    if all(row in v["median_us"] for v in venvs):
      lines.append(f"| {row} | " + " | ".join(f"{v['median_us'][row]:.1f}" for v in venvs) + " |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  sys.exit(main())
