"""`make demo`'s whole run against its pure-torch twin and the Keras port.

Usage:
  python -m benchmarks.demo_wall [--rounds 3] [--steps 20000] [--out DIR]
  python -m benchmarks.demo_wall --one BACKEND SEED STEPS OUT   (one process)

Each run is examples/td3_pendulum.py as `make demo` runs it (`--steps N
--seed S --jit-compile`, the script's own evaluation and checkpoints every
2,000 steps), less `--export` (the serving step after training, which the
other backends do not have), with `--backend torchbridge` (the default
`tb.TorchModule`s), `--backend torch` (the twin: the same agent in pure
torch) or `--backend tf` (the Keras port). Round r runs seed r, the three
backends one after the other, their order rotating from round to round,
each in a fresh process (`harness.run_process`: it waits for a quiet machine
first and records how busy the others kept it).

The wall time is the whole process's, as a user of `make demo` waits for it
(Python's start and the imports included). It is split into the imports
(the process's wall less the script's own), the train steps (the script's
`sec_per_train_step` times its steps: the first step's tracing, capture and
XLA compile included), the policy's calls (each environment step's and
the evaluations', timed by the script around `agent.policy`, the first
call's tracing and capture included) and the rest of the script (the
environment, the replay buffer, checkpoints and summaries). Writes
demo_wall.json and demo_wall.md.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks import harness

BACKENDS = {"torchbridge": "torchbridge", "pure torch": "torch", "Keras port": "tf"}


def one(backend, seed, steps, out):
  """Runs the script in this process; returns its record (seconds)."""
  sys.path.insert(0, os.path.join(harness.ROOT, "examples"))
  import td3_pendulum  # pylint: disable=import-outside-toplevel

  argv = ["--backend", backend, "--steps", str(steps), "--seed", str(seed)]
  argv += ["--out", out, "--jit-compile"]
  start = time.perf_counter()
  stdout = sys.stdout
  sys.stdout = sys.stderr  # stdout: the JSON line only
  try:
    td3_pendulum.main(argv)
  finally:
    sys.stdout = stdout
  script_s = time.perf_counter() - start
  with open(os.path.join(out, "results.json")) as f:
    results = json.load(f)
  timing = results["timing_this_process"]
  return {
    "backend": backend,
    "seed": seed,
    "steps": steps,
    "argv": argv,
    "script_s": script_s,
    # `harness.run_process` replaces it with the whole process's.
    "wall_s": script_s,
    "train_s": results["sec_per_train_step"] * results["train_steps"],
    "train_steps": results["train_steps"],
    "ms_per_train_step": 1e3 * results["sec_per_train_step"],
    "final_return": results["eval_returns"][-1][1],
    "eval_returns": results["eval_returns"],
    "runners": results.get("runners"),
    "versions": results["versions"],
    # The policy's calls (exploration and evaluation), the first included;
    # the first call and train step alone (tracing, capture, XLA compile).
    "policy_s": timing["policy_seconds"],
    "policy_calls": timing["policy_calls"],
    "first_policy_call_s": timing["first_policy_call_s"],
    "first_train_step_s": timing["first_train_step_s"],
  }


def measure(rounds, steps, log=print):
  """{backend label: [records, one per round]}; round r runs seed r."""
  runs = {label: [] for label in BACKENDS}
  labels = list(BACKENDS)
  with tempfile.TemporaryDirectory(prefix="demo_wall_") as tmp:
    for r in range(rounds):
      order = labels[r % len(labels) :] + labels[: r % len(labels)]
      for label in order:
        out = os.path.join(tmp, f"{r}_{BACKENDS[label]}", "run")
        record = harness.run_process(
          "benchmarks.demo_wall",
          ["--one", BACKENDS[label], r, steps, out],
          timeout=3600,
        )
        log(
          f"  demo wall round {r + 1}/{rounds} {label}: {record['wall_s']:.1f} s, "
          f"train step {record['ms_per_train_step']:.2f} ms, "
          f"final return {record['final_return']:.1f}"
        )
        runs[label].append(record)
  return runs


def parts(record):
  """A run's wall time in parts that add up to it (seconds); the policy's
  calls apart where the run timed them."""
  timed = {
    "imports, Python's start and exit": record["wall_s"] - record["script_s"],
    "train steps": record["train_s"],
  }
  rest = record["script_s"] - record["train_s"]
  if "policy_s" in record:
    timed["the policy's calls"] = record["policy_s"]
    rest -= record["policy_s"]
  timed["the rest of the script"] = rest
  return timed


def _per_call_us(record):
  """The policy's call, microseconds: the mean after the first."""
  n = record["policy_calls"]
  return 1e6 * (record["policy_s"] - record["first_policy_call_s"]) / max(n - 1, 1)


def markdown(data):
  runs, steps, source = data["backends"], data["steps"], data["source"]
  labels, rounds = list(runs), data["rounds"]
  changed = (
    f", with changes to {', '.join(source['changed_since'])}" if source["changed_since"] else ""
  )
  lines = [
    f"Measured at {source['commit'][:10]}{changed}: `make demo`'s command "
    f"(examples/td3_pendulum.py --steps {steps:,} --jit-compile, without --export) per "
    f"backend, round r on seed r, {rounds} rounds, the order rotating, a process per run; "
    "the whole process's wall time, seconds.",
    "",
    "| seed | " + " | ".join(labels) + " | torchbridge / pure torch | torchbridge / Keras port |",
    "|---|" + "---|" * (len(labels) + 2),
  ]
  for r in range(rounds):
    walls = {label: runs[label][r]["wall_s"] for label in labels}
    lines.append(
      f"| {r} | "
      + " | ".join(f"{walls[label]:.1f}" for label in labels)
      + f" | {walls['torchbridge'] / walls['pure torch']:.2f}x"
      + f" | {walls['torchbridge'] / walls['Keras port']:.2f}x |"
    )
  medians = {label: float(np.median([r["wall_s"] for r in runs[label]])) for label in labels}
  lines.append(
    "| median | "
    + " | ".join(f"{medians[label]:.1f}" for label in labels)
    + f" | {medians['torchbridge'] / medians['pure torch']:.2f}x"
    + f" | {medians['torchbridge'] / medians['Keras port']:.2f}x |"
  )
  lines += [
    "",
    "| median of the rounds | " + " | ".join(labels) + " |",
    "|---|" + "---|" * len(labels),
  ]

  def row(title, value, digits):
    """A row of each backend's median of `value(record)`."""
    cells = [f"{np.median([value(r) for r in runs[label]]):.{digits}f}" for label in labels]
    lines.append(f"| {title} | " + " | ".join(cells) + " |")

  for part in parts(runs[labels[0]][0]):
    row(f"{part}, s", lambda r, part=part: parts(r)[part], 1)
  row(
    "train step, ms (the script's mean, the first step included)",
    lambda r: r["ms_per_train_step"],
    2,
  )
  if all("policy_s" in r for label in labels for r in runs[label]):
    calls = runs[labels[0]][0]["policy_calls"]
    row(f"the policy's call, us ({calls:,} calls, the mean after the first)", _per_call_us, 0)
    row(
      "the first policy call, s (tracing, capture and check, XLA compile)",
      lambda r: r["first_policy_call_s"],
      2,
    )
    row("the first train step, s (the same)", lambda r: r["first_train_step_s"], 2)
  lines.append(
    "| final evaluation return (each seed) | "
    + " | ".join(" / ".join(f"{r['final_return']:.1f}" for r in runs[label]) for label in labels)
    + " |"
  )
  lines.append(
    "| other processes' load meanwhile, cores (each seed) | "
    + " | ".join(
      " / ".join(f"{r.get('foreign_load_cores', 0.0):.2f}" for r in runs[label]) for label in labels
    )
    + " |"
  )
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.demo_wall", description=__doc__)
  parser.add_argument("--one", nargs=4, metavar=("BACKEND", "SEED", "STEPS", "OUT"))
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=20000)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = parser.parse_args(argv)
  if args.one:
    backend, seed, steps, out = args.one
    print(json.dumps(one(backend, int(seed), int(steps), out)))
    return 0
  data = {
    "source": harness.environment(2, "cpu")["source"],
    "rounds": args.rounds,
    "steps": args.steps,
    "backends": measure(args.rounds, args.steps),
  }
  harness.write_results(args.out, "demo_wall", data, markdown(data))
  return 0


if __name__ == "__main__":
  sys.exit(main())
