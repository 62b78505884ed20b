"""The main jobs against Stable-Baselines3, each run a process of its own.

`python -m benchmarks.rl_jobs [td3|ppo|both] [--seeds 0 1 2] [--out DIR]`
`python -m benchmarks.rl_jobs plot [--results PATH] [--out DIR]`: the
learning curves again from the committed rl_jobs.json (`benchmarks.rl_plots`)

TD3 on Pendulum-v1, 20k steps: examples/td3_pendulum.py as `make demo`
runs it (the default `tb.TorchModule`, `--jit-compile`, the burst
schedule), the same script with `--backend torch` (pure PyTorch, the same
schedule, train steps one after another in Python) and `--backend tf` (the
Keras port, `--jit-compile`, the same bursts), against SB3's TD3 with the
RL Zoo's settings (`benchmarks.sb3_process`). PPO-LSTM on CartPole without
velocities, 150k steps: examples/ppo_lstm_cartpole.py as `make ppo` runs
it and with `--backend torch`, against SB3-contrib's RecurrentPPO with the
RL Zoo's settings. For each seed the contenders run one after another, the
order rotating from seed to seed.

Each row's wall time is the training loop's as the user waits for it: the
examples' loop with its evaluations (TD3's every 2,000 steps, PPO's every
5,120), SB3's `learn()` (no evaluation for TD3; for RecurrentPPO its
evaluations at the same steps are timed and taken out). The final return
is each run's last evaluation (TD3: 5 episodes, PPO: 10; the examples'
seeds, SB3's model evaluated the same way). `policy call` is the mean
time of a policy call in the TD3 run (one observation; exploration and
evaluation alike). Writes rl_jobs.json and rl_jobs.md, and from them the
learning curves rl_jobs_td3.png and rl_jobs_ppo.png (`benchmarks.rl_plots`).
"""

import argparse
import contextlib
import json
import os
import sys
import tempfile

import numpy as np

from benchmarks import harness

EXAMPLES = os.path.join(harness.ROOT, "examples")

TD3 = {
  "torchbridge": ["--backend", "torchbridge", "--jit-compile"],
  "pure torch": ["--backend", "torch"],
  "Keras port": ["--backend", "tf", "--jit-compile"],
  "SB3 TD3": None,
}
PPO = {
  "torchbridge": ["--backend", "torchbridge"],
  "pure torch": ["--backend", "torch"],
  "SB3-contrib RecurrentPPO": None,
}


def _one(job, argv):
  """Runs an example's main in this process; prints one JSON line."""
  sys.path.insert(0, EXAMPLES)
  with contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON line only
    if job == "td3":
      import td3_pendulum as script  # pylint: disable=import-outside-toplevel
    else:
      import ppo_lstm_cartpole as script  # pylint: disable=import-outside-toplevel
    script.main(argv)
  out = argv[argv.index("--out") + 1]
  with open(os.path.join(out, "results.json")) as f:
    results = json.load(f)
  record = {
    "loop_s": results["wall_seconds_this_process"],
    "final_return": results["eval_returns"][-1][1],
    "eval_returns": results["eval_returns"],
  }
  if job == "td3":
    timing = results["timing_this_process"]
    record.update(
      gradient_steps=results["train_steps"],
      train_calls=results["train_calls"],
      policy_call_us=1e6 * timing["policy_seconds"] / timing["policy_calls"],
      first_train_call_s=timing["first_train_step_s"],
      runners=results.get("runners"),
    )
  else:
    record.update(
      first_step_at_or_above_400=results["first_step_at_or_above_400"],
      updates=results["updates"],
    )
  print(json.dumps(record))


# --tiny: a smoke run of every contender (no learning to speak of).
TINY = {
  "td3": (600, ["--start-steps", "400", "--eval-every", "200"]),
  "ppo": (1024, ["--eval-every", "512"]),
}


def _runs(job, seed, out, tiny=False):
  contenders = TD3 if job == "td3" else PPO
  steps, tiny_flags = TINY[job] if tiny else (20_000 if job == "td3" else 150_000, [])
  jobs = {}
  for name, flags in contenders.items():
    run_dir = os.path.join(out, job, f"{name.replace(' ', '_')}_s{seed}")
    if flags is None:
      algo = "td3" if job == "td3" else "recurrent-ppo"
      args = [algo, "--seed", seed, "--out", run_dir]
      if tiny:
        args += ["--steps", steps, *(["--eval-every", "512"] if job == "ppo" else [])]
      jobs[name] = lambda args=args: _sb3(
        harness.run_process("benchmarks.sb3_process", args, timeout=1800)
      )
    else:
      argv = [*flags, *tiny_flags, "--steps", str(steps), "--seed", str(seed), "--out", run_dir]
      args = ["one", job, "--", *argv]
      jobs[name] = lambda args=args: harness.run_process("benchmarks.rl_jobs", args, timeout=1800)
  return jobs


def _sb3(record):
  record["loop_s"] = record["learn_s"]
  return record


def _rotated(jobs, k):
  names = list(jobs)
  k %= len(names)
  return {name: jobs[name] for name in names[k:] + names[:k]}


def _summary(job, by_seed):
  names = list(next(iter(by_seed.values())))
  rows = {}
  for name in names:
    records = [by_seed[s][name] for s in by_seed]
    loop = [r["loop_s"] for r in records]
    final = [r["final_return"] for r in records]
    row = {
      "loop_s_mean": float(np.mean(loop)),
      "loop_s": loop,
      "final_return_mean": float(np.mean(final)),
      "final_return_std": float(np.std(final)),
      "final_return": final,
      "process_s": [r["wall_s"] for r in records],
      "foreign_load_cores": [r["foreign_load_cores"] for r in records],
    }
    if job == "td3" and "policy_call_us" in records[0]:
      row["policy_call_us_mean"] = float(np.mean([r["policy_call_us"] for r in records]))
    if job == "td3":
      row["gradient_steps"] = [r["gradient_steps"] for r in records]
    if job == "ppo":
      firsts = [r["first_step_at_or_above_400"] for r in records]
      row["first_at_or_above_400"] = firsts
      reached = [f for f in firsts if f is not None]
      row["first_at_or_above_400_mean"] = (
        float(np.mean(reached)) if len(reached) == len(firsts) else None
      )
    rows[name] = row
  baseline = rows[names[-1]]["loop_s_mean"]
  for row in rows.values():
    row["loop_vs_sb3"] = row["loop_s_mean"] / baseline
  if job == "td3":
    torch_us = rows["pure torch"]["policy_call_us_mean"]
    for row in rows.values():
      if "policy_call_us_mean" in row:
        row["policy_call_vs_pure_torch"] = row["policy_call_us_mean"] / torch_us
  return rows


def _commit(source):
  changed = " (torchbridge changed since)" if source["changed_since"] else ""
  return f"{(source['commit'] or 'unknown')[:12]}{changed}"


def _markdown(data):
  lines = [
    "# The main jobs against Stable-Baselines3",
    "",
    f"Measured by `python -m benchmarks.rl_jobs` ({len(data['seeds'])} seeds, each "
    "contender a process of its own, one after another, the order rotating), on "
    f"{data['environment']['cpu']} ({data['environment']['cpu_count']} cores), at "
    f"commit {_commit(data['environment']['source'])}.",
    "",
  ]
  titles = {
    "td3": "TD3, Pendulum-v1, 20k steps (the loop with its evaluations; SB3: `learn()`)",
    "ppo": "PPO-LSTM, CartPole without velocities, 150k steps",
  }
  for job, rows in data["jobs"].items():
    lines += [f"## {titles[job]}", ""]
    if job == "td3":
      lines += [
        "| | training loop | vs SB3 | final return (mean, std) | per seed | gradient steps | policy call |",
        "|---|---|---|---|---|---|---|",
      ]
    else:
      lines += [
        "| | training loop | vs SB3 | final return (mean, std) | per seed | first >= 400 (per seed) |",
        "|---|---|---|---|---|---|",
      ]
    for name, row in rows.items():
      per_seed = ", ".join(f"{r:.1f}" for r in row["final_return"])
      cells = [
        name,
        f"{row['loop_s_mean']:.1f} s",
        f"{row['loop_vs_sb3']:.2f}x",
        f"{row['final_return_mean']:.1f} ({row['final_return_std']:.1f})",
        per_seed,
      ]
      if job == "td3":
        cells.append(str(row["gradient_steps"][0]))
        us = row.get("policy_call_us_mean")
        cells.append(
          f"{us:.0f} us ({row['policy_call_vs_pure_torch']:.2f}x pure torch)" if us else "-"
        )
      else:
        cells.append(
          ", ".join(
            str(f) if f is not None else "not reached" for f in row["first_at_or_above_400"]
          )
        )
      lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["one"]:
    return _one(argv[1], argv[3:])
  if argv[:1] == ["plot"]:
    from benchmarks import rl_plots  # pylint: disable=import-outside-toplevel

    return rl_plots.main(argv[1:])
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("job", choices=("td3", "ppo", "both"), nargs="?", default="both")
  p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  p.add_argument("--out", default=os.path.join(harness.ROOT, "benchmarks", "results"))
  p.add_argument("--runs", default=None, help="directory for the runs (default: a temporary one)")
  p.add_argument("--tiny", action="store_true", help="a smoke run: a few hundred steps each")
  args = p.parse_args(argv)
  jobs = ("td3", "ppo") if args.job == "both" else (args.job,)
  runs = args.runs or tempfile.mkdtemp(prefix="rl_jobs_")
  data = {"seeds": args.seeds, "tiny": args.tiny, "jobs": {}, "runs": {}}
  previous = os.path.join(args.out, "rl_jobs.json")
  if os.path.exists(previous):  # a job measured alone keeps the other's rows
    with open(previous) as f:
      old = json.load(f)
    data["jobs"].update({k: v for k, v in old.get("jobs", {}).items() if k not in jobs})
    data["runs"].update({k: v for k, v in old.get("runs", {}).items() if k not in jobs})
  for job in jobs:
    by_seed = {}
    for k, seed in enumerate(args.seeds):
      by_seed[seed] = {}
      for name, run in _rotated(_runs(job, seed, runs, args.tiny), k).items():
        print(f"{job} seed {seed}: {name}", file=sys.stderr, flush=True)
        by_seed[seed][name] = run()
      order = list(_runs(job, seed, runs, args.tiny))
      by_seed[seed] = {name: by_seed[seed][name] for name in order}
    data["jobs"][job] = _summary(job, by_seed)
    data["runs"][job] = by_seed
  import torch  # noqa: F401  pylint: disable=import-outside-toplevel
  import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel

  data["environment"] = harness.environment(2, "cpu")
  data["failures"] = harness.FAILURES
  harness.write_results(args.out, "rl_jobs", data, _markdown(data))
  from benchmarks import rl_plots  # pylint: disable=import-outside-toplevel

  rl_plots.write(data, args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
