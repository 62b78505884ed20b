"""The learning curves of `make bench-rl`'s runs, drawn from rl_jobs.json alone.

`python -m benchmarks.rl_plots [--results PATH] [--out DIR]` (or
`python -m benchmarks.rl_jobs plot`) reads the results file
`benchmarks.rl_jobs` wrote and draws, per job, every backend's evaluation
curves: one colour per backend, each seed a thin line of that colour, the
mean over the seeds a thick one. Nothing is run again and nothing random is
drawn, so the same file gives the same picture (byte for byte, on the same
matplotlib). Writes rl_jobs_td3.png and rl_jobs_ppo.png beside the results.

TD3 on Pendulum spends its first 10,000 steps on random actions (the
untrained actor's returns, about -1295 to -1360 by seed); the left panel
shows the whole run with that phase shaded, the right one the last
evaluations on their own scale, where the seeds and the backends can be
told apart. The titles give each job's budget of environment steps (PPO's
last evaluation falls at the end of the rollout that reaches it).
SB3's TD3 is evaluated once, at the end (`learn()` runs no evaluation): its
seeds are markers at the last step. PPO-LSTM's backends are all evaluated
along the way: one panel, the task's maximum (500) and the 400 the tables
count from marked.
"""

import argparse
import functools
import json
import os
import sys

import numpy as np
import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# Drawn for the documentation's content column (about 690 pixels on a
# laptop): 7.2 inches wide shows 9-point text at about 12 pixels; saved at
# 200 dpi for screens that have more pixels.
WIDTH_IN, DPI = 7.2, 200
STYLE = {
  "font.size": 9,
  "axes.titlesize": 9,
  "axes.labelsize": 9,
  "xtick.labelsize": 8,
  "ytick.labelsize": 8,
  "legend.fontsize": 8,
  "legend.title_fontsize": 8,
}

# One colour per backend (Okabe-Ito: told apart with any colour vision).
COLOURS = {
  "torchbridge": "#0072B2",
  "pure torch": "#E69F00",
  "Keras port": "#009E73",
  "SB3 TD3": "#CC79A7",
  "SB3-contrib RecurrentPPO": "#CC79A7",
}
_OTHER = ("#D55E00", "#56B4E9", "#F0E442", "#000000")

TITLES = {
  "td3": "TD3 on Pendulum-v1",
  "ppo": "PPO-LSTM on CartPole-v1 without velocities",
}
# What one evaluation is (rl_jobs.py's docstring: the examples' own).
EVALUATIONS = {
  "td3": "mean return of 5 deterministic episodes",
  "ppo": "mean return of 10 greedy episodes",
}
# TD3's random-action phase (the RL Zoo's `learning_starts`, the script's `--start-steps`).
TD3_RANDOM_STEPS = 10_000
# PPO: the task's maximum return, and the threshold the tables count from.
PPO_MAX, PPO_THRESHOLD = 500.0, 400.0
# Each job's budget of environment steps (rl_jobs.py's `--steps`; not --tiny).
# A run stops at the first rollout that reaches it (PPO: 8 environments x 32
# steps), and evaluates there: PPO's last evaluation is at 150,016.
BUDGETS = {"td3": 20_000, "ppo": 150_000}


def colour(backend: str, order: int = 0) -> str:
  """The backend's colour; a backend not named above gets one by its place."""
  return COLOURS.get(backend, _OTHER[order % len(_OTHER)])


def curves(data: dict, job: str) -> dict:
  """Each backend's evaluation curves, seed by seed.

  Args:
    data: rl_jobs.json, loaded.
    job: "td3" or "ppo".

  Returns:
    `{backend: {seed: (steps, returns)}}` as float arrays, backends in the
    results' order; a backend with no evaluation curve (SB3's TD3) maps to
    `{}`.
  """
  runs = data["runs"][job]
  out = {}
  for seed in sorted(runs, key=int):
    for backend, record in runs[seed].items():
      per_seed = out.setdefault(backend, {})
      if record.get("eval_returns"):
        steps, returns = np.asarray(record["eval_returns"], dtype=float).T
        per_seed[int(seed)] = (steps, returns)
  return out


def finals(data: dict, job: str) -> dict:
  """`{backend: {seed: final return}}`: the last evaluation of each run."""
  runs = data["runs"][job]
  out = {}
  for seed in sorted(runs, key=int):
    for backend, record in runs[seed].items():
      out.setdefault(backend, {})[int(seed)] = float(record["final_return"])
  return out


def mean_curve(per_seed: dict) -> tuple[np.ndarray, np.ndarray]:
  """The mean over seeds at the steps every seed was evaluated at."""
  step_sets = [set(steps.tolist()) for steps, _ in per_seed.values()]
  common = np.array(sorted(set.intersection(*step_sets)))
  stacked = [
    np.interp(common, steps, returns) for steps, returns in per_seed.values()
  ]  # exact: `common` holds only evaluated steps
  return common, np.mean(stacked, axis=0)


def _draw_curves(ax, by_backend: dict, from_step: float = 0.0) -> None:
  """Each seed thin, the mean thick, in the backend's colour; from `from_step` on."""
  for order, (backend, per_seed) in enumerate(by_backend.items()):
    if not per_seed:
      continue
    c = colour(backend, order)
    for steps, returns in per_seed.values():
      kept = steps >= from_step
      ax.plot(steps[kept] / 1e3, returns[kept], color=c, lw=0.9, alpha=0.55, zorder=2)
    steps, mean = mean_curve(per_seed)
    kept = steps >= from_step
    ax.plot(steps[kept] / 1e3, mean[kept], color=c, lw=2.6, marker="o", ms=3.5, zorder=3)


def _legend(fig, data: dict, job: str, by_backend: dict, marks=()) -> None:
  """One entry per backend (its colour), then the reference lines `marks`."""
  seeds = len(data["runs"][job])
  handles = []
  for order, (backend, per_seed) in enumerate(by_backend.items()):
    c = colour(backend, order)
    if per_seed:
      handles.append(Line2D([], [], color=c, lw=2.6, marker="o", ms=3.5, label=backend))
    else:
      label = f"{backend}: final evaluation only ({seeds} seeds x, mean o)"
      handles.append(Line2D([], [], color=c, lw=0, marker="x", ms=6, mew=2, label=label))
  fig.legend(
    handles=handles + list(marks),
    loc="lower center",
    ncol=2,
    frameon=False,
    title="thin: one seed; thick: the mean of the seeds",
  )


def _final_markers(ax, data: dict, job: str, by_backend: dict, at_step: float) -> None:
  """The runs without a curve: each seed's final return at the last step."""
  last = finals(data, job)
  for order, (backend, per_seed) in enumerate(by_backend.items()):
    if per_seed:
      continue
    c = colour(backend, order)
    values = list(last[backend].values())
    ax.plot([at_step / 1e3] * len(values), values, "x", color=c, ms=7, mew=2, zorder=4)
    ax.plot([at_step / 1e3], [np.mean(values)], "o", color=c, ms=8, mfc="none", mew=2, zorder=4)


def _last_step(by_backend: dict) -> int:
  """The last evaluated step of any backend's seed."""
  return max(int(steps[-1]) for per_seed in by_backend.values() for steps, _ in per_seed.values())


def _subtitle(data: dict, job: str, by_backend: dict) -> str:
  """Which runs the figure shows: the seeds, the steps, the evaluations."""
  seeds = ", ".join(str(s) for s in sorted(data["runs"][job], key=int))
  all_steps = [steps for per_seed in by_backend.values() for steps, _ in per_seed.values()]
  last = _last_step(by_backend)
  gaps = np.concatenate([np.diff(steps) for steps in all_steps])
  values, counts = np.unique(gaps, return_counts=True)
  every = int(values[np.argmax(counts)]) if len(values) else 0
  irregular = any(len(steps) > 1 and steps[-1] - steps[-2] != every for steps in all_steps)
  cadence = f"every {every:,} steps" + (" and at the end" if irregular else "")
  steps = f"{last:,} environment steps each"
  budget = None if data.get("tiny") else BUDGETS.get(job)
  if budget is not None and budget <= last < budget + max(every, 1):
    steps = f"{budget:,} environment steps each"
    if last != budget:
      steps += f" (the last evaluation at {last:,})"
  return f"seeds {seeds}; {steps}\nan evaluation {cadence}: the {EVALUATIONS[job]}"


def _styled(draw):
  """`draw` with STYLE's sizes, whoever calls it (fonts are fixed when drawn)."""

  @functools.wraps(draw)
  def styled(data: dict) -> Figure:
    with matplotlib.rc_context(STYLE):
      return draw(data)

  return styled


@_styled
def td3_figure(data: dict) -> Figure:
  """TD3: the whole run, and the last evaluations on their own scale."""
  by_backend = curves(data, "td3")
  last_step = _last_step(by_backend)
  fig = Figure(figsize=(WIDTH_IN, 5.6), dpi=DPI)
  whole, end = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
  if not data.get("tiny"):  # a smoke run (--tiny) starts training at 400 steps
    whole.axvspan(0, TD3_RANDOM_STEPS / 1e3, color="0.92", zorder=0)
    whole.text(
      TD3_RANDOM_STEPS / 2e3,
      -150,
      "random\nactions",
      ha="center",
      va="top",
      color="0.35",
    )
  _draw_curves(whole, by_backend)
  _final_markers(whole, data, "td3", by_backend, last_step)
  whole.set_xlim(0, last_step / 1e3 + 0.6)
  whole.set_xticks(np.arange(0, last_step / 1e3 + 1, 2))
  whole.set_ylim(-1550, 0)
  whole.set_title("the whole run")
  # The last evaluations: from the first at which every run is past -200.
  zoom_from = _zoom_start(by_backend, -200.0)
  _draw_curves(end, by_backend, zoom_from)
  _final_markers(end, data, "td3", by_backend, last_step)
  values = [
    r
    for per in by_backend.values()
    for steps, returns in per.values()
    for s, r in zip(steps, returns)
    if s >= zoom_from
  ] + [v for per in finals(data, "td3").values() for v in per.values()]
  pad = max(0.1 * (max(values) - min(values)), 1.0)
  end.set_xlim(zoom_from / 1e3 - 0.3, last_step / 1e3 + 0.3)
  end.set_ylim(min(values) - pad, max(values) + pad)
  end.set_xticks(
    sorted(
      {
        s / 1e3
        for per in by_backend.values()
        for st, _ in per.values()
        for s in st
        if s >= zoom_from
      }
    )
  )
  end.set_title(f"zoomed: from {zoom_from / 1e3:g}k steps on")
  for ax in (whole, end):
    ax.set_xlabel("environment steps (thousands)")
    ax.grid(True, color="0.88", lw=0.6, zorder=1)
  whole.set_ylabel("evaluation return (sum of rewards per episode;\nhigher is better, 0 the best)")
  fig.suptitle(f"{TITLES['td3']}\n{_subtitle(data, 'td3', by_backend)}")
  _legend(fig, data, "td3", by_backend)
  fig.subplots_adjust(left=0.12, right=0.98, top=0.83, bottom=0.23, wspace=0.25)
  return fig


def _zoom_start(by_backend: dict, level: float) -> float:
  """The first evaluated step from which every curve stays above `level`."""
  start = 0.0
  for per_seed in by_backend.values():
    for steps, returns in per_seed.values():
      below = np.nonzero(returns < level)[0]
      if len(below):
        start = max(start, steps[min(below[-1] + 1, len(steps) - 1)])
  return start


@_styled
def ppo_figure(data: dict) -> Figure:
  """PPO-LSTM: one panel, the maximum and the 400 threshold marked."""
  by_backend = curves(data, "ppo")
  last_step = _last_step(by_backend)
  fig = Figure(figsize=(WIDTH_IN, 5.2), dpi=DPI)
  ax = fig.subplots()
  marks = [
    ax.axhline(PPO_MAX, color="0.4", lw=1.0, ls=":", zorder=1, label="500: the most there is"),
    ax.axhline(
      PPO_THRESHOLD, color="0.4", lw=1.0, ls="--", zorder=1, label="400: the tables' threshold"
    ),
  ]
  _draw_curves(ax, by_backend)
  ax.set_xlim(0, last_step / 1e3 + 2)
  ax.set_ylim(0, PPO_MAX + 40)
  ax.set_xlabel("environment steps (thousands)")
  ax.set_ylabel("evaluation return\n(steps balanced per episode, at most 500)")
  ax.grid(True, color="0.88", lw=0.6, zorder=0)
  fig.suptitle(f"{TITLES['ppo']}\n{_subtitle(data, 'ppo', by_backend)}")
  _legend(fig, data, "ppo", by_backend, marks)
  fig.subplots_adjust(left=0.12, right=0.98, top=0.85, bottom=0.25)
  return fig


FIGURES = {"td3": td3_figure, "ppo": ppo_figure}


def write(data: dict, out: str) -> list[str]:
  """Draws every job the results hold into `out`; returns the files written."""
  os.makedirs(out, exist_ok=True)
  written = []
  for job in data["runs"]:
    if job not in FIGURES:
      continue
    path = os.path.join(out, f"rl_jobs_{job}.png")
    FIGURES[job](data).savefig(path, dpi=DPI)
    written.append(path)
  return written


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  p.add_argument("--results", default=os.path.join(RESULTS, "rl_jobs.json"))
  p.add_argument("--out", default=None, help="directory for the pictures (default: the results')")
  args = p.parse_args(argv)
  with open(args.results) as f:
    data = json.load(f)
  for path in write(data, args.out or os.path.dirname(os.path.abspath(args.results))):
    print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
