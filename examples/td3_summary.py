"""Summarizes TD3 runs: a markdown table and one learning curve for all.

  python examples/td3_summary.py runs/td3

reads every DIR/*/results.json written by td3_pendulum.py, prints per run
the evaluation return at 20k steps (or the last), the first step at which it
reached -250 or better, and the wall time per train step, then the per
backend summary, and writes DIR/learning_curve.png.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from td3 import reporting  # noqa: E402
from td3.reporting import load_runs  # noqa: E402

THRESHOLD = -250.0


def main(run_dir):
  runs = load_runs(run_dir)
  print("| backend | seed | return at last eval | first step >= -250 | ms per train step |")
  print("|---|---|---|---|---|")
  by_backend = {}
  for r in sorted(runs, key=lambda r: (r["backend"], r["seed"])):
    reached = next((s for s, ret in r["eval_returns"] if ret >= THRESHOLD), None)
    last_step, last = r["eval_returns"][-1]
    print(
      f"| {r['backend']} | {r['seed']} | {last:.1f} (step {last_step}) | "
      f"{reached if reached is not None else 'not reached'} | "
      f"{r['sec_per_train_step'] * 1e3:.2f} |"
    )
    by_backend.setdefault(r["backend"], []).append((reached, last))
  print()
  for backend, results in by_backend.items():
    ok = sum(1 for reached, _ in results if reached is not None and reached <= 20000)
    print(f"{backend}: {ok} of {len(results)} seeds reached -250 within 20,000 steps")
  curve = reporting.plot_learning_curves(run_dir, os.path.join(run_dir, "learning_curve.png"))
  print(f"\nlearning curve: {curve}")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "runs/td3")
