"""Progress bar, learning curves and the closing summary of a TD3 run."""

import glob
import json
import os
import sys
import time

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402


class ProgressBar:
  """One terminal line, redrawn in place on a terminal, else every 10%."""

  def __init__(self, total, start=0, stream=sys.stderr):
    self.total, self.stream = total, stream
    self.tty = stream.isatty()
    self.start_time, self.start_step = time.time(), start
    self._last_draw, self._last_decile = 0.0, start * 10 // max(total, 1)

  def update(self, step, episode_return=None, eval_return=None):
    now = time.time()
    decile = step * 10 // max(self.total, 1)
    if self.tty and now - self._last_draw < 0.2 and step < self.total:
      return
    if not self.tty and decile == self._last_decile and step < self.total:
      return
    self._last_draw, self._last_decile = now, decile
    rate = (step - self.start_step) / max(now - self.start_time, 1e-9)
    filled = int(30 * step / max(self.total, 1))
    line = f"[{'#' * filled}{'.' * (30 - filled)}] {step}/{self.total} steps  {rate:6.1f} steps/s"
    if episode_return is not None:
      line += f"  episode {episode_return:8.1f}"
    if eval_return is not None:
      line += f"  eval {eval_return:8.1f}"
    self.stream.write(("\r" + line) if self.tty else (line + "\n"))
    self.stream.flush()

  def close(self):
    if self.tty:
      self.stream.write("\n")


def load_runs(run_dir):
  """Every `run_dir/*/results.json`, in path order; exits if there is none."""
  runs = []
  for path in sorted(glob.glob(os.path.join(run_dir, "*", "results.json"))):
    with open(path) as f:
      runs.append(json.load(f))
  if not runs:
    raise SystemExit(f"no */results.json under {run_dir}")
  return runs


def plot_learning_curves(runs_dir, path):
  """Plots every run found in `runs_dir/*/results.json` into `path`."""
  paths = sorted(glob.glob(os.path.join(runs_dir, "*", "results.json")))
  colors = {"torchbridge": "tab:blue", "torch": "tab:orange", "tf": "tab:green"}
  fig, ax = plt.subplots(figsize=(7, 4.5))
  labelled = set()
  for results_path in paths:
    with open(results_path) as f:
      r = json.load(f)
    if not r.get("eval_returns"):
      continue
    steps, returns = zip(*r["eval_returns"])
    backend = r["backend"]
    ax.plot(
      steps,
      returns,
      color=colors.get(backend),
      alpha=0.8,
      label=None if backend in labelled else backend,
    )
    labelled.add(backend)
  ax.axhline(-250, color="gray", linestyle="--", linewidth=1)
  ax.set_xlabel("environment steps")
  ax.set_ylabel("mean evaluation return")
  ax.set_title("TD3 on Pendulum-v1 (one line per seed)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def summary(results, out_dir):
  lines = [
    f"\nTD3 on Pendulum-v1, backend {results['backend']}, seed "
    f"{results['seed']}, {results['steps']} environment steps"
  ]
  if results["resumed_from"] is not None:
    lines.append(f"  (resumed from the checkpoint at step {results['resumed_from']})")
  lines.append("  evaluation return (mean of the evaluation episodes):")
  for step, ret in results["eval_returns"]:
    lines.append(f"    step {step:6d}: {ret:8.1f}")
  lines.append(
    f"  train step: {results['sec_per_train_step'] * 1e3:.2f} ms on "
    f"average over {results['train_steps']} steps"
  )
  return "\n".join(lines + closing_lines(results, out_dir))


def closing_lines(results, out_dir):
  """The end of a run's summary (TD3's and PPO's): what crossed the bridge
  and where the run's files are."""
  lines = []
  stats = results["exchange_stats"]
  if results["backend"] == "torchbridge":
    lines.append(
      f"  crossed the TF/torch boundary: {stats['zero_copy']} tensors "
      f"zero-copy, {stats['copied']} copied ({stats['bytes_copied']} bytes)"
    )
  lines.append(f"  results:        {os.path.join(out_dir, 'results.json')}")
  lines.append(f"  learning curve: {results['curve']}")
  lines.append(f"  checkpoints:    {os.path.join(out_dir, 'checkpoints')}")
  lines.append(f"  TensorBoard:    tensorboard --logdir {os.path.join(out_dir, 'tensorboard')}")
  return lines
