"""results.json, learning curves and the closing summary of a PPO run."""

import glob
import json
import os

import gymnasium as gym
import matplotlib
import numpy as np
import tensorflow as tf
import torch

import torchbridge as tb
from td3.reporting import ProgressBar  # noqa: F401  (the same bar as TD3's)
from td3.reporting import closing_lines

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402

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


_PANELS = (
  (
    "LSTM vs MLP, bridge vs pure torch",
    {
      "lstm masked (torchbridge)": "tab:blue",
      "lstm masked (torch)": "tab:orange",
      "mlp masked (torchbridge)": "tab:gray",
    },
  ),
  (
    "masked vs unmasked loss (bridge)",
    {
      "lstm masked (torchbridge)": "tab:blue",
      "lstm unmasked (torchbridge)": "tab:red",
      "lstm masked (torchbridge, 128-step rollouts, T=128)": "tab:green",
      "lstm unmasked (torchbridge, 128-step rollouts, T=128)": "tab:purple",
    },
  ),
)


def plot_learning_curves(runs_dir, path):
  """Plots every PPO run found in `runs_dir/*/results.json` into `path`:
  thin lines per seed, a thick line for the mean over seeds; variants not in
  the two panels' legends go to the first panel."""
  runs = {}
  for results_path in sorted(glob.glob(os.path.join(runs_dir, "*", "results.json"))):
    with open(results_path) as f:
      r = json.load(f)
    if "policy" in r and r.get("eval_returns"):
      runs.setdefault(label(r), []).append(np.asarray(r["eval_returns"], float))
  # One panel above the other, each the docs column's width (legible at it).
  fig, axes = plt.subplots(2, 1, figsize=(7.5, 9), sharex=True)
  known = {name for _, colors in _PANELS for name in colors}
  for ax, (title, colors) in zip(axes, _PANELS):
    names = [n for n in runs if n in colors or (ax is axes[0] and n not in known)]
    for name in names:
      color = colors.get(name)
      curves = runs[name]
      for curve in curves:
        ax.plot(curve[:, 0], curve[:, 1], color=color, alpha=0.25, linewidth=1)
      length = min(len(c) for c in curves)
      mean = np.mean([c[:length, 1] for c in curves], axis=0)
      ax.plot(
        curves[0][:length, 0],
        mean,
        color=color,
        linewidth=2.2,
        label=f"{name}, mean of {len(curves)}",
      )
    ax.axhline(SOLVED, color="gray", linestyle="--", linewidth=1)
    ax.set_title(title, fontsize=12)
    ax.set_ylabel("mean evaluation return (greedy)", fontsize=10)
    ax.tick_params(labelsize=10)
    ax.legend(fontsize=9, loc="lower right")
  axes[-1].set_xlabel("environment steps", fontsize=10)
  fig.suptitle("PPO on CartPole-v1 without velocities (thin: one seed)", fontsize=12)
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  plt.close(fig)
  return path


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
