"""Summarizes PPO runs: a markdown table per variant and one learning curve.

  python examples/ppo_summary.py runs/ppo

reads every DIR/*/results.json written by ppo_lstm_cartpole.py and prints,
per run, the evaluation return at the end of the budget, the best one, the
first step at which it reached 400 (of 500) and the time per PPO update;
then, per variant (policy, loss, backend), how many seeds reached 400 within
the budget. Writes DIR/learning_curve.png with every run.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ppo import reporting  # noqa: E402
from td3.reporting import load_runs  # noqa: E402


def main(run_dir):
  runs = load_runs(run_dir)
  print("| policy, loss (backend) | seed | eval return at the end | best eval | "
        "first step >= 400 | ms per update |")
  print("|---|---|---|---|---|---|")
  variants = {}
  for r in sorted(runs, key=lambda r: (reporting.label(r), r["seed"])):
    last_step, last = r["eval_returns"][-1]
    best = max(ret for _, ret in r["eval_returns"])
    reached = r["first_step_at_or_above_400"]
    print(f"| {reporting.label(r)} | {r['seed']} | {last:.1f} (step {last_step}) | "
          f"{best:.1f} | {reached if reached is not None else 'not reached'} | "
          f"{r['ms_per_update']:.1f} |")
    variants.setdefault(reporting.label(r), []).append(r)
  print()
  for name, group in variants.items():
    reached = sum(r["first_step_at_or_above_400"] is not None for r in group)
    ended = sum(r["eval_returns"][-1][1] >= reporting.SOLVED for r in group)
    budget = max(r["steps"] for r in group)
    print(f"{name}: {reached} of {len(group)} seeds reached 400 within {budget:,} "
          f"steps; {ended} of {len(group)} end at 400 or more")
  curve = reporting.plot_learning_curves(run_dir, os.path.join(run_dir, "learning_curve.png"))
  print(f"\nlearning curve: {curve}")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "runs/ppo")
