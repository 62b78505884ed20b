"""Summarizes PPO runs: a markdown table per variant and one plot of them all.

  python examples/ppo_summary.py runs/ppo [--plot PATH]

reads every DIR/*/results.json written by ppo_lstm_cartpole.py and prints,
per run, the evaluation return at the end of the budget, the mean of all
its evaluations (the area under its curve), the first step at which it
reached 400 (of 500), the share of padding in its training batches and the
time per PPO update;
then, per variant (policy, loss, backend), how many seeds reached 400 within
the budget. Draws every run's evaluation curve into PATH (default
DIR/learning_curve.png): nothing is trained, so the committed runs in
examples/results/ppo/ redraw their picture.
"""

import argparse
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ppo import reporting  # noqa: E402
from td3.reporting import load_runs  # noqa: E402


def main(run_dir, plot=None):
  runs = load_runs(run_dir)
  print(
    "| policy, loss (backend) | seed | eval return at the end | mean of all evals | "
    "first step >= 400 | padding in the batches | ms per update |"
  )
  print("|---|---|---|---|---|---|---|")
  variants = {}
  for r in sorted(runs, key=lambda r: (reporting.label(r), r["seed"])):
    last_step, last = r["eval_returns"][-1]
    area = sum(ret for _, ret in r["eval_returns"]) / len(r["eval_returns"])
    reached = r["first_step_at_or_above_400"]
    padded = r.get("mean_padded_fraction")
    print(
      f"| {reporting.label(r)} | {r['seed']} | {last:.1f} (step {last_step}) | "
      f"{area:.1f} | {reached if reached is not None else 'not reached'} | "
      f"{'n/a' if padded is None else f'{100 * padded:.0f}%'} | "
      f"{r['ms_per_update']:.1f} |"
    )
    variants.setdefault(reporting.label(r), []).append(r)
  print()
  for name, group in variants.items():
    reached = sum(r["first_step_at_or_above_400"] is not None for r in group)
    ended = sum(r["eval_returns"][-1][1] >= reporting.SOLVED for r in group)
    budget = max(r["steps"] for r in group)
    area = [sum(ret for _, ret in r["eval_returns"]) / len(r["eval_returns"]) for r in group]
    print(
      f"{name}: {reached} of {len(group)} seeds reached 400 within {budget:,} "
      f"steps; {ended} of {len(group)} end at 400 or more; mean of all "
      f"evaluations {sum(area) / len(area):.1f}"
    )
  curve = reporting.plot_variants(runs, plot or os.path.join(run_dir, "learning_curve.png"))
  print(f"\nlearning curve: {curve}")


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("run_dir", nargs="?", default="runs/ppo")
  parser.add_argument(
    "--plot", help="where to draw the curves (default RUN_DIR/learning_curve.png)"
  )
  args = parser.parse_args()
  main(args.run_dir, args.plot)
