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

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ppo import reporting  # noqa: E402
from td3.reporting import load_runs  # noqa: E402
import matplotlib  # noqa: E402  (after reporting chose the Agg backend)
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

# Drawn for the documentation's content column, as the benchmarks' plots:
# 7.2 inches wide, 9-point text, saved at 200 dpi.
WIDTH_IN, DPI = 7.2, 200
STYLE = {
  "font.size": 9,
  "axes.titlesize": 9,
  "axes.labelsize": 9,
  "xtick.labelsize": 8,
  "ytick.labelsize": 8,
  "legend.fontsize": 8,
}
PPO_MAX = 500.0  # CartPole-v1's episode limit: the most a policy can reach

# The two panels: which variants each compares, and each variant's colour
# (Okabe-Ito: told apart with any colour vision). A variant is keyed by
# (policy, loss, backend, rollout steps, padded length).
_BRIDGE = ("lstm", "masked", "torchbridge", 32, 32)
PANELS = (
  (
    "memory, and the bridge against pure torch (32-step rollouts)",
    {
      _BRIDGE: "#0072B2",
      ("lstm", "masked", "torch", 32, 32): "#E69F00",
      ("mlp", "masked", "torchbridge", 32, 32): "#000000",
    },
  ),
  (
    "masked against unmasked loss, through the bridge",
    {
      _BRIDGE: "#0072B2",
      ("lstm", "unmasked", "torchbridge", 32, 32): "#D55E00",
      ("lstm", "masked", "torchbridge", 128, 128): "#009E73",
      ("lstm", "unmasked", "torchbridge", 128, 128): "#CC79A7",
    },
  ),
)
_MORE = ("#56B4E9", "#F0E442", "#999999")  # variants no panel names (the first panel's)


def variant(r):
  """The run's variant: (policy, loss, backend, rollout steps, padded length)."""
  hyper = r["hyperparameters"]
  return (r["policy"], r["loss"], r["backend"], hyper["n_steps"], hyper["max_seq_len"])


def variant_name(key):
  """A variant as a reader says it: "LSTM, masked loss, pure torch"."""
  policy, loss, backend, n_steps, max_seq_len = key
  policy = "LSTM" if policy == "lstm" else f"{policy.upper()} (no memory)"
  backend = "pure torch" if backend == "torch" else backend
  if (n_steps, max_seq_len) == (32, 32):
    return f"{policy}, {loss} loss, {backend}"
  return f"{policy}, {loss} loss, {n_steps}-step rollouts padded to {max_seq_len}, {backend}"


def _mean_curve(curves):
  """The mean over seeds at the steps every seed was evaluated at."""
  common = sorted(set.intersection(*(set(steps.tolist()) for steps, _ in curves)))
  means = [np.mean([returns[steps == s][0] for steps, returns in curves]) for s in common]
  return np.asarray(common, float), np.asarray(means)


def variants_figure(runs):
  """Every run's evaluation returns, one colour per variant: each seed a
  thin line, the mean over seeds a thick one; steps in thousands."""
  by_variant = {}
  for r in sorted(runs, key=lambda r: (variant(r), r["seed"])):
    if r.get("eval_returns"):
      steps, returns = np.asarray(r["eval_returns"], float).T
      by_variant.setdefault(variant(r), []).append((steps, returns))
  known = {key for _, colours in PANELS for key in colours}
  extra = [key for key in by_variant if key not in known]
  last_step = max(steps[-1] for curves in by_variant.values() for steps, _ in curves)
  with matplotlib.rc_context(STYLE):
    fig = Figure(figsize=(WIDTH_IN, 10.4), dpi=DPI)
    axes = fig.subplots(2, 1)
    for i, (ax, (title, colours)) in enumerate(zip(axes, PANELS)):
      colours = dict(colours)
      if i == 0:
        colours.update({key: _MORE[k % len(_MORE)] for k, key in enumerate(extra)})
      handles = []
      for key, colour in colours.items():
        curves = by_variant.get(key)
        if not curves:
          continue
        for steps, returns in curves:
          ax.plot(steps / 1e3, returns, color=colour, lw=0.9, alpha=0.55, zorder=2)
        steps, mean = _mean_curve(curves)
        ax.plot(steps / 1e3, mean, color=colour, lw=2.6, marker="o", ms=3, zorder=3)
        label = f"{variant_name(key)} ({len(curves)} seeds)"
        handles.append(Line2D([], [], color=colour, lw=2.6, marker="o", ms=3, label=label))
      ax.axhline(PPO_MAX, color="0.4", lw=1.0, ls=":", zorder=1)
      ax.axhline(reporting.SOLVED, color="0.4", lw=1.0, ls="--", zorder=1)
      ax.set_title(title)
      ax.set_xlim(0, last_step / 1e3 + 2)
      ax.set_ylim(0, PPO_MAX + 40)
      ax.set_xlabel("environment steps (thousands)")
      ax.set_ylabel("evaluation return\n(steps balanced, at most 500)")
      ax.grid(True, color="0.88", lw=0.6, zorder=0)
      ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
    fig.suptitle(
      "PPO on CartPole-v1 without velocities: the variants, before reward scaling\n"
      "an evaluation every 5,120 steps (the mean return of 10 greedy episodes)\n"
      "thin: one seed; thick: the mean of the seeds; dotted: 500, the most there is; "
      "dashed: 400"
    )
    fig.subplots_adjust(left=0.12, right=0.98, top=0.9, bottom=0.12, hspace=0.58)
  return fig


def plot_variants(runs, path):
  """Draws `variants_figure(runs)` into `path`; returns `path`."""
  variants_figure(runs).savefig(path, dpi=DPI)
  return path


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
  curve = plot_variants(runs, plot or os.path.join(run_dir, "learning_curve.png"))
  print(f"\nlearning curve: {curve}")


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("run_dir", nargs="?", default="runs/ppo")
  parser.add_argument(
    "--plot", help="where to draw the curves (default RUN_DIR/learning_curve.png)"
  )
  args = parser.parse_args()
  main(args.run_dir, args.plot)
