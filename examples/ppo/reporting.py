"""results.json, learning curves and the closing summary of a PPO run."""

import gymnasium as gym
import matplotlib
import numpy as np
import tensorflow as tf
import torch

import torchbridge as tb
from td3.reporting import ProgressBar  # noqa: F401  (the same bar as TD3's)
from td3.reporting import closing_lines
from td3.reporting import load_runs

matplotlib.use("Agg")  # files only
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

SOLVED = 400.0


def label(r):
  hyper = r["hyperparameters"]
  cut = (
    ""
    if hyper["max_seq_len"] == 32 and hyper["n_steps"] == 32
    else f", {hyper['n_steps']}-step rollouts, T={hyper['max_seq_len']}"
  )
  return f"{r['policy']} {r['loss']} ({r['backend']}{cut})"


def results(run, args, wall_seconds):
  progress = run.progress
  return {
    "backend": args.backend,
    "policy": args.policy,
    "loss": args.loss,
    "schedule": args.schedule,
    "reward_scale": args.reward_scale,
    "seed": args.seed,
    "steps": args.steps,
    "eval_returns": progress["eval_returns"],
    "first_step_at_or_above_400": next(
      (s for s, r in progress["eval_returns"] if r >= SOLVED), None
    ),
    "final_eval_return": progress["eval_returns"][-1][1] if progress["eval_returns"] else None,
    "ms_per_update": 1e3 * progress["update_seconds"] / max(progress["updates"], 1),
    "mean_padded_fraction": float(np.mean(progress.get("padded_fractions") or [np.nan])),
    "updates": progress["updates"],
    "rollout_seconds": progress["rollout_seconds"],
    "episodes": progress["episodes"],
    "resumed_from": progress["resumed_from"],
    "wall_seconds_this_process": wall_seconds,
    "threads": args.threads,
    "hyperparameters": vars(run.hyper),
    "versions": {
      "torch": torch.__version__,
      "tensorflow": tf.__version__,
      "gymnasium": gym.__version__,
    },
    "exchange_stats": tb.exchange_stats(),
  }


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
  # What the runs were: evaluated every so many steps (the first
  # evaluation's step), and trained before reward scaling where no run
  # records it (the committed variants in examples/results/ppo/).
  every = min(int(curves[0][0][0]) for curves in by_variant.values())
  scaled = any("reward_scale" in r for r in runs)
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
      ax.axhline(SOLVED, color="0.4", lw=1.0, ls="--", zorder=1)
      ax.set_title(title)
      ax.set_xlim(0, last_step / 1e3 + 2)
      ax.set_ylim(0, PPO_MAX + 40)
      ax.set_xlabel("environment steps (thousands)")
      ax.set_ylabel("evaluation return\n(steps balanced, at most 500)")
      ax.grid(True, color="0.88", lw=0.6, zorder=0)
      ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
    fig.suptitle(
      "PPO on CartPole-v1 without velocities: the variants"
      + ("" if scaled else ", before reward scaling")
      + f"\nan evaluation every {every:,} steps (the mean return of greedy episodes)\n"
      "thin: one seed; thick: the mean of the seeds; dotted: 500, the most there is; "
      "dashed: 400"
    )
    fig.subplots_adjust(left=0.12, right=0.98, top=0.9, bottom=0.12, hspace=0.58)
  return fig


def plot_variants(runs, path):
  """Draws `variants_figure(runs)` into `path`; returns `path`."""
  variants_figure(runs).savefig(path, dpi=DPI)
  return path


def plot_learning_curves(runs_dir, path):
  """Draws every PPO run found in `runs_dir/*/results.json` into `path`
  (`variants_figure`); returns `path`."""
  return plot_variants([r for r in load_runs(runs_dir) if "policy" in r], path)


def summary(results, out_dir):
  lines = [
    f"\nPPO on CartPole-v1 without velocities: {label(results)}, seed "
    f"{results['seed']}, {results['steps']} environment steps"
  ]
  if results["resumed_from"] is not None:
    lines.append(f"  (resumed from the checkpoint at step {results['resumed_from']})")
  lines.append("  evaluation return (mean of greedy episodes):")
  for step, ret in results["eval_returns"]:
    lines.append(f"    step {step:7d}: {ret:6.1f}")
  lines.append(
    f"  PPO update: {results['ms_per_update']:.2f} ms on average over {results['updates']} updates"
  )
  return "\n".join(lines + closing_lines(results, out_dir))
