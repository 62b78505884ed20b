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

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402

SOLVED = 400.0


def label(r):
  hyper = r["hyperparameters"]
  cut = ("" if hyper["max_seq_len"] == 32 and hyper["n_steps"] == 32 else
         f", {hyper['n_steps']}-step rollouts, T={hyper['max_seq_len']}")
  return f"{r['policy']} {r['loss']} ({r['backend']}{cut})"


def results(run, args, wall_seconds):
  progress = run.progress
  return {
      "backend": args.backend, "policy": args.policy, "loss": args.loss,
      "seed": args.seed, "steps": args.steps,
      "eval_returns": progress["eval_returns"],
      "first_step_at_or_above_400": next(
          (s for s, r in progress["eval_returns"] if r >= SOLVED), None),
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
      "versions": {"torch": torch.__version__, "tensorflow": tf.__version__,
                   "gymnasium": gym.__version__},
      "exchange_stats": tb.exchange_stats(),
  }


def plot_learning_curves(runs_dir, path):
  """Plots every PPO run found in `runs_dir/*/results.json` into `path`."""
  colors = {"lstm masked (torchbridge)": "tab:blue",
            "lstm masked (torch)": "tab:orange",
            "lstm unmasked (torchbridge)": "tab:red",
            "mlp masked (torchbridge)": "tab:gray",
            "lstm masked (torchbridge, 128-step rollouts, T=128)": "tab:green",
            "lstm unmasked (torchbridge, 128-step rollouts, T=128)": "tab:purple"}
  fig, ax = plt.subplots(figsize=(7, 4.5))
  labelled = set()
  for results_path in sorted(glob.glob(os.path.join(runs_dir, "*", "results.json"))):
    with open(results_path) as f:
      r = json.load(f)
    if "policy" not in r or not r.get("eval_returns"):
      continue
    steps, returns = zip(*r["eval_returns"])
    name = label(r)
    ax.plot(steps, returns, color=colors.get(name), alpha=0.8,
            label=None if name in labelled else name)
    labelled.add(name)
  ax.axhline(SOLVED, color="gray", linestyle="--", linewidth=1)
  ax.set_xlabel("environment steps")
  ax.set_ylabel("mean evaluation return (greedy)")
  ax.set_title("PPO on CartPole-v1 without velocities (one line per seed)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def summary(results, out_dir):
  lines = [f"\nPPO on CartPole-v1 without velocities: {label(results)}, seed "
           f"{results['seed']}, {results['steps']} environment steps"]
  if results["resumed_from"] is not None:
    lines.append(f"  (resumed from the checkpoint at step {results['resumed_from']})")
  lines.append("  evaluation return (mean of greedy episodes):")
  for step, ret in results["eval_returns"]:
    lines.append(f"    step {step:7d}: {ret:6.1f}")
  lines.append(f"  PPO update: {results['ms_per_update']:.2f} ms on average over "
               f"{results['updates']} updates")
  stats = results["exchange_stats"]
  if results["backend"] == "torchbridge":
    lines.append(
        f"  crossed the TF/torch boundary: {stats['zero_copy']} tensors "
        f"zero-copy, {stats['copied']} copied ({stats['bytes_copied']} bytes)")
  lines.append(f"  results:        {os.path.join(out_dir, 'results.json')}")
  lines.append(f"  learning curve: {results['curve']}")
  lines.append(f"  checkpoints:    {os.path.join(out_dir, 'checkpoints')}")
  lines.append(f"  TensorBoard:    tensorboard --logdir {os.path.join(out_dir, 'tensorboard')}")
  return "\n".join(lines)
