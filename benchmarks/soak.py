"""The soak: long runs whose memory, descriptors, threads and copies stay flat.

Three runs, each in a child process of its own (issue 28, "a soak"):
  - `mlp_eager`: bridged training steps of a small MLP (a `tb.TorchModule`
    around a torch `nn.Sequential`, 32-64-64-1, batch 64, a new input batch
    every step, Keras Adam), eagerly;
  - `mlp_function`: the same step inside `tf.function` (both with
    `run="torch"`: torch from C++ through the bridge, every call crossing);
  - `td3`: examples/td3_pendulum.py's own training loop, torchbridge backend
    (environment, replay buffer, `tf.function` train step, evaluations,
    checkpoints and TensorBoard summaries as a user's run has them), for as
    many environment steps.
Every `--sample-every` steps each process records, between two steps on its
main thread: resident memory (VmRSS, /proc/self/status), open file
descriptors (/proc/self/fd), threads (/proc/self/status) and
`tb.exchange_stats()`. After the warm-up (the first `WARMUP_FRACTION` of the
steps; for TD3 of the steps after its first training episode) the bounds of
`BOUNDS` must hold; `check_run` says which do not, and the command exits 1
if any fails.

  PYTHONPATH=. python -m benchmarks.soak --parallel       # 100,000 steps each
  PYTHONPATH=. python -m benchmarks.soak --steps 2000 --td3-steps 1500 --out /tmp/s
  PYTHONPATH=. python -m benchmarks.soak --check benchmarks/results/soak.json
  PYTHONPATH=. python -m benchmarks.soak --plot benchmarks/results/soak.json

`make soak` runs the first (the three runs at once; without --parallel one
after the other: the curves are the same, the wall time longer). Writes
OUT/soak.json (the curves: step -> rss_mb, fds, threads, copies; per run the
warm-up point, the growth after it, the bounds and their verdicts),
rewritten every `POLL_S` seconds while the runs go on, so a soak cut short
leaves its curves so far, and OUT/soak.png (RSS over steps; descriptors and
threads). `--check` evaluates the bounds again over a written file (and
rewrites it); `--plot` draws a written file's soak.png again, and nothing
else.
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = ("mlp_eager", "mlp_function", "td3")
WARMUP_FRACTION = 0.1
# Pendulum's time limit: TD3's train steps run in one burst at each
# episode's end (examples/td3_pendulum.py, --schedule burst).
TD3_EPISODE_STEPS = 200
POLL_S = 20.0
# The bounds after warm-up, and why.
# RSS: the largest rise over the resident size at the warm-up point, in MB.
# Measured here (2 cores, 100,000 steps each): the MLP runs drift by under
# 0.3 MB after warm-up (a few bytes a step: the samples this recorder keeps,
# the allocators settling); TD3's resident size moves in steps of 5-8 MB
# both ways as glibc's and TF's allocators take and return arenas around
# its evaluations and checkpoints. 20 MB sits above that noise, and a leak
# of 1 KB a step (one 256-float activation) still crosses it within 20,000
# steps, 250 bytes a step within the 90,000 steps after warm-up. TD3's bound
# adds what its own replay buffer must touch as it fills (np.zeros pages, 36
# bytes per environment step, 3.4 MB over 100,000 steps).
# Descriptors and threads: the count at the end equals the count at the
# warm-up point, and no sample after it exceeds that by more than the slack
# (0: no pool or file starts lazily after warm-up in these runs).
# Copies: the exchange's copy counter grows by no more per step in the
# second half after warm-up than in the first. The MLP's crossings are all
# zero-copy (0 copies); TD3 copies one 256x1 float32 tensor (1 KB) per actor
# update, 0.5 a step: the gradient torch gives for the critic's `action`
# input is a column of `torch.cat`'s gradient, strided, which TF cannot
# share (DESIGN.md, "Zero copy"): constant per step, allowed and reported.
BOUNDS = {
  "rss_growth_mb": 20.0,
  "td3_replay_mb_per_step": 36 / 2**20,
  "fd_slack": 0,
  "thread_slack": 0,
}


# --- what one process measures -------------------------------------------


def sample(step, start):
  """The process's resident MB, descriptors, threads and exchange counters."""
  import torchbridge as tb

  status = {}
  with open("/proc/self/status") as f:
    for line in f:
      key, _, value = line.partition(":")
      status[key] = value.split()
  stats = tb.exchange_stats()
  return {
    "step": int(step),
    "t_s": round(time.perf_counter() - start, 2),
    "rss_mb": round(int(status["VmRSS"][0]) / 1024, 2),
    "fds": len(os.listdir("/proc/self/fd")),
    "threads": int(status["Threads"][0]),
    "copies": stats["copied"],
    "bytes_copied": stats["bytes_copied"],
    "zero_copy": stats["zero_copy"],
  }


class Recorder:
  """Samples every `every` steps into `path` (rewritten each time, so a run
  cut short leaves what it had)."""

  def __init__(self, run, steps, every, path):
    self.record = {"run": run, "steps": steps, "pid": os.getpid(), "samples": []}
    self.every, self.path = every, path
    self.start = time.perf_counter()

  def __call__(self, step, force=False, **extra):
    if step % self.every and not force:
      return
    self.record["samples"].append(dict(sample(step, self.start), **extra))
    self.record["wall_s"] = round(time.perf_counter() - self.start, 1)
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(self.record, f)
    os.replace(tmp, self.path)


def run_mlp(mode, steps, every, threads, path):
  """`steps` bridged training steps of the small MLP, eagerly or in
  `tf.function`, sampled every `every` steps."""
  import torch
  import numpy as np
  import tensorflow as tf

  import torchbridge as tb

  torch.set_num_threads(threads)
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  torch.manual_seed(0)
  net_torch = torch.nn.Sequential(
    torch.nn.Linear(32, 64),
    torch.nn.ReLU(),
    torch.nn.Linear(64, 64),
    torch.nn.ReLU(),
    torch.nn.Linear(64, 1),
  )
  # Graph calls take run="torch": the soak's MLP runs are the bridge's
  # crossings (the default runner would run its translation, no crossing;
  # the TD3 run soaks that). Eager calls run torch on any runner.
  net = tb.TorchModule(net_torch, name="mlp", run="torch")
  optimizer = tf.keras.optimizers.Adam(1e-3)
  tb.reset_exchange_stats()

  def train_step(x_tf, y_tf):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((net(x_tf) - y_tf) ** 2)
    grads = tape.gradient(loss, net.trainable_variables)
    optimizer.apply_gradients(zip(grads, net.trainable_variables))
    return loss

  if mode == "function":
    train_step = tf.function(train_step)
  rng = np.random.default_rng(0)
  recorder = Recorder(f"mlp_{mode}", steps, every, path)
  recorder(0)
  loss = None
  for step in range(1, steps + 1):
    # A new batch every step: fresh tensors cross the boundary each time.
    x = rng.standard_normal((64, 32), dtype=np.float32)
    y = np.tanh(x[:, :4].sum(axis=1, keepdims=True))
    loss = train_step(tf.constant(x), tf.constant(y))
    if step % every == 0 or step == steps:
      recorder(step, force=True, loss=round(float(loss), 5))
  return 0


def run_td3(steps, every, threads, start_steps, path, run_dir):
  """examples/td3_pendulum.py's main for `steps` environment steps, sampled
  every `every` environment steps (the training environment's `step`
  counted)."""
  sys.path.insert(0, os.path.join(ROOT, "examples"))
  import td3_pendulum

  recorder = Recorder("td3", steps, every, path)
  script_run = td3_pendulum.Run

  class SampledRun(script_run):
    def __init__(self, args):
      super().__init__(args)
      env_step, counter = self.env.step, [0]

      def step(action):
        out = env_step(action)
        counter[0] += 1
        recorder(counter[0], force=counter[0] == steps)
        return out

      self.env.step = step
      recorder(0)

  td3_pendulum.Run = SampledRun
  try:
    with contextlib.redirect_stdout(sys.stderr):
      td3_pendulum.main(
        [
          "--backend",
          "torchbridge",
          "--steps",
          str(steps),
          "--start-steps",
          str(start_steps),
          "--threads",
          str(threads),
          "--out",
          run_dir,
        ]
      )
  finally:
    td3_pendulum.Run = script_run
  return 0


# --- the bounds -------------------------------------------------------------


def warmup_step(run, steps, td3_start_steps):
  """The step from which the bounds hold: the first WARMUP_FRACTION of the
  steps. For TD3, of those after its first training episode: the
  random-action phase runs no train step, and the first episode after it
  ends in the first training burst, which traces the training graph (150 MB
  of TF's graph and kernels, once)."""
  if run == "td3":
    episode = TD3_EPISODE_STEPS
    first_trained = -(-(td3_start_steps + 1) // episode) * episode
    return first_trained + int(WARMUP_FRACTION * (steps - first_trained))
  return int(WARMUP_FRACTION * steps)


def rss_bound_mb(run, steps, bounds=BOUNDS):
  bound = bounds["rss_growth_mb"]
  if run == "td3":
    bound += bounds["td3_replay_mb_per_step"] * steps
  return bound


def check_run(run, samples, warm_step, rss_bound, bounds=BOUNDS):
  """The summary of one run's curve after `warm_step`, and the bounds it
  fails (an empty `failures` list when it holds them all)."""
  after = [s for s in samples if s["step"] >= warm_step]
  if len(after) < 3:
    return {"failures": [f"{run}: too few samples after warm-up ({len(after)})"]}
  warm, end = after[0], after[-1]
  rss_growth = max(s["rss_mb"] for s in after) - warm["rss_mb"]
  span = max(end["step"] - warm["step"], 1)
  mid = after[len(after) // 2]

  def per_step(a, b):
    return (b["copies"] - a["copies"]) / max(b["step"] - a["step"], 1)

  first_half, second_half = per_step(warm, mid), per_step(mid, end)
  summary = {
    "warmup_step": warm["step"],
    "end_step": end["step"],
    "rss_mb_at_warmup": warm["rss_mb"],
    "rss_mb_at_end": end["rss_mb"],
    "rss_mb_max_after_warmup": max(s["rss_mb"] for s in after),
    "rss_max_growth_mb": round(rss_growth, 2),
    "rss_end_growth_mb": round(end["rss_mb"] - warm["rss_mb"], 2),
    # Least-squares slope over the samples after warm-up, bytes per step.
    "rss_slope_bytes_per_step": round(_slope(after) * 2**20, 2),
    "steps_per_s_after_warmup": round(span / max(end["t_s"] - warm["t_s"], 1e-9), 1),
    "fds_at_warmup": warm["fds"],
    "fds_at_end": end["fds"],
    "fds_max_after_warmup": max(s["fds"] for s in after),
    "threads_at_warmup": warm["threads"],
    "threads_at_end": end["threads"],
    "threads_max_after_warmup": max(s["threads"] for s in after),
    "copies_at_warmup": warm["copies"],
    "copies_at_end": end["copies"],
    "copies_per_step_after_warmup": (end["copies"] - warm["copies"]) / span,
    "copies_per_step_first_half": first_half,
    "copies_per_step_second_half": second_half,
    "bytes_copied_after_warmup": end["bytes_copied"] - warm["bytes_copied"],
    "bounds": {
      "rss_max_growth_mb": rss_bound,
      "fd_slack": bounds["fd_slack"],
      "thread_slack": bounds["thread_slack"],
      "copies_per_step": "second half <= first half after warm-up",
    },
  }
  failures = []
  if rss_growth >= rss_bound:
    failures.append(f"{run}: RSS grew {rss_growth:.1f} MB after warm-up (bound {rss_bound:.1f})")
  for key, slack in (("fds", bounds["fd_slack"]), ("threads", bounds["thread_slack"])):
    top = summary[f"{key}_max_after_warmup"]
    if end[key] != warm[key] or top > warm[key] + slack:
      failures.append(
        f"{run}: {key} not flat after warm-up: {warm[key]} at step {warm['step']}, "
        f"{end[key]} at the end, {top} at most (slack {slack})"
      )
  if second_half > first_half + 1e-9:
    failures.append(
      f"{run}: exchange copies per step grew after warm-up: {first_half:.4g} then {second_half:.4g}"
    )
  summary["failures"] = failures
  return summary


def _slope(samples):
  n = len(samples)
  xs = [s["step"] for s in samples]
  ys = [s["rss_mb"] for s in samples]
  mx, my = sum(xs) / n, sum(ys) / n
  var = sum((x - mx) ** 2 for x in xs)
  return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


# --- the whole soak ---------------------------------------------------------


def _child_command(run, args, tmp):
  command = [sys.executable, "-m", "benchmarks.soak", "--child", run]
  command += ["--threads", str(args.threads), "--partial", os.path.join(tmp, f"{run}.json")]
  if run == "td3":
    command += ["--steps", str(args.td3_steps), "--sample-every", str(args.td3_sample_every)]
    command += ["--td3-start-steps", str(args.td3_start_steps)]
    command += ["--td3-dir", os.path.join(tmp, "td3_run")]
  else:
    command += ["--steps", str(args.steps), "--sample-every", str(args.sample_every)]
  return command


def _load(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def collect(args, tmp, procs, started, finished):
  """soak.json's content from what the children have written so far."""
  results = {
    "steps": {"mlp": args.steps, "td3": args.td3_steps},
    "sample_every": {"mlp": args.sample_every, "td3": args.td3_sample_every},
    "threads_per_framework": args.threads,
    "td3_start_steps": args.td3_start_steps,
    "warmup_fraction": WARMUP_FRACTION,
    "bounds": BOUNDS,
    "runs": {},
    "failures": [],
  }
  for run in args.runs:
    record = _load(os.path.join(tmp, f"{run}.json")) or {"samples": []}
    steps = args.td3_steps if run == "td3" else args.steps
    proc = procs[run]
    entry = {
      "pid": proc.pid,
      "returncode": proc.returncode,
      "wall_s": round(finished.get(run, time.perf_counter()) - started[run], 1),
      "steps_planned": steps,
      "steps_reached": record["samples"][-1]["step"] if record["samples"] else 0,
      "samples": record["samples"],
    }
    warm = warmup_step(run, steps, args.td3_start_steps)
    entry["summary"] = check_run(run, record["samples"], warm, rss_bound_mb(run, steps))
    # A run still going has a summary of its curve so far, no verdict yet.
    entry["summary"]["partial"] = proc.returncode is None
    if proc.returncode is not None:
      results["failures"] += entry["summary"]["failures"]
      if proc.returncode != 0:
        results["failures"].append(f"{run}: the process exited with {proc.returncode}")
      elif entry["steps_reached"] != steps:
        results["failures"].append(f"{run}: reached step {entry['steps_reached']} of {steps}")
    results["runs"][run] = entry
  results["complete"] = all(p.returncode is not None for p in procs.values())
  return results


def write(results, out):
  tmp = os.path.join(out, "soak.json.tmp")
  with open(tmp, "w") as f:
    json.dump(results, f, indent=1)
  os.replace(tmp, os.path.join(out, "soak.json"))


# Each run as the docs name it, and a style that keeps it visible where
# the curves coincide (descriptors and threads are equal across runs): the
# first drawn wide and pale under the others, each with its own dashes and
# markers, the markers staggered so that no two fall on one step.
PLOT_STYLE = {
  "mlp_eager": dict(
    label="MLP, eager", color="tab:blue", linewidth=5, alpha=0.45, marker="o", markevery=(0, 12)
  ),
  "mlp_function": dict(
    label="MLP, tf.function",
    color="tab:orange",
    linewidth=2.2,
    linestyle="--",
    marker="s",
    markevery=(4, 12),
  ),
  "td3": dict(
    label="TD3 (environment steps)",
    color="tab:green",
    linewidth=1.4,
    linestyle="-.",
    marker="^",
    markevery=(8, 12),
  ),
}


def plot(results, path):
  """The curves, one quantity a panel (resident memory, open descriptors,
  threads), drawn to be read at the docs' column width (about 690 px)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib import ticker

  fig, axes = plt.subplots(
    3, 1, figsize=(7.5, 8), sharex=True, gridspec_kw={"height_ratios": [2, 1, 1]}
  )
  ax_rss, ax_fds, ax_threads = axes
  for run, entry in results["runs"].items():
    xs = [s["step"] for s in entry["samples"]]
    style = dict(PLOT_STYLE.get(run, {"label": run, "linewidth": 2}), markersize=5)
    label = style.pop("label")
    (line,) = ax_rss.plot(xs, [s["rss_mb"] for s in entry["samples"]], label=label, **style)
    style["color"] = line.get_color()
    ax_fds.plot(xs, [s["fds"] for s in entry["samples"]], **style)
    ax_threads.plot(xs, [s["threads"] for s in entry["samples"]], **style)
    if "summary" in entry and "warmup_step" in entry["summary"]:
      ax_rss.axvline(entry["summary"]["warmup_step"], color=style["color"], linestyle=":")
  ax_rss.set_title("Soak: bridged training steps (dotted: end of warm-up)", fontsize=12)
  ax_rss.legend(fontsize=10)
  for ax, label in (
    (ax_rss, "resident memory (MB)"),
    (ax_fds, "open descriptors"),
    (ax_threads, "threads"),
  ):
    ax.set_ylabel(label, fontsize=10)
    ax.tick_params(labelsize=10)
    ax.yaxis.set_major_locator(ticker.MaxNLocator(4, integer=ax is not ax_rss))
  for ax in (ax_fds, ax_threads):
    ax.margins(y=0.25)  # the flat curves off the frame
  ax_threads.xaxis.set_major_locator(ticker.MaxNLocator(5))
  ax_threads.xaxis.set_major_formatter(
    ticker.FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x else "0")
  )
  ax_threads.set_xlabel("step (MLP: training steps; TD3: environment steps)", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  plt.close(fig)


def soak(args):
  os.makedirs(args.out, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix="soak-")
  procs, started, finished, logs = {}, {}, {}, {}
  env = dict(
    os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
  )
  try:
    # The runs one after the other (--parallel: all at once; their curves
    # are unchanged, their wall times are not comparable).
    pending = list(args.runs)
    while True:
      for run, proc in procs.items():
        if proc.poll() is not None and run not in finished:
          finished[run] = time.perf_counter()
          wall = finished[run] - started[run]
          print(f"{run}: exited {proc.returncode} after {wall:.0f} s", flush=True)
      running = [run for run in procs if run not in finished]
      if pending and (args.parallel or not running):
        run = pending.pop(0)
        logs[run] = open(os.path.join(tmp, f"{run}.log"), "w")
        procs[run] = subprocess.Popen(
          _child_command(run, args, tmp),
          cwd=ROOT,
          env=env,
          stdout=logs[run],
          stderr=subprocess.STDOUT,
        )
        started[run] = time.perf_counter()
        print(f"{run}: started (pid {procs[run].pid})", flush=True)
        continue
      if not running:
        break
      write(collect(args, tmp, procs, started, finished), args.out)
      _wait_any(procs, POLL_S)
    results = collect(args, tmp, procs, started, finished)
    for run, proc in procs.items():
      if proc.returncode:
        logs[run].flush()
        with open(os.path.join(tmp, f"{run}.log")) as f:
          results["runs"][run]["log_tail"] = f.read()[-3000:]
    write(results, args.out)
    plot(results, os.path.join(args.out, "soak.png"))
  finally:
    for proc in procs.values():
      if proc.poll() is None:
        proc.kill()
    for log in logs.values():
      log.close()
    shutil.rmtree(tmp, ignore_errors=True)
  _print(results)
  return 1 if results["failures"] else 0


def _wait_any(procs, timeout):
  """Waits until one of the running children exits, or `timeout` s."""
  running = [p for p in procs.values() if p.returncode is None]
  deadline = time.perf_counter() + timeout
  while time.perf_counter() < deadline and all(p.poll() is None for p in running):
    time.sleep(0.5)


def recheck(path):
  """The bounds evaluated again over the curves of a soak.json (as BOUNDS
  now stands), which is rewritten, with its plot; returns the exit status."""
  with open(path) as f:
    results = json.load(f)
  results["bounds"], results["failures"] = BOUNDS, []
  for run, entry in results["runs"].items():
    steps = entry["steps_planned"]
    warm = warmup_step(run, steps, results["td3_start_steps"])
    entry["summary"] = check_run(run, entry["samples"], warm, rss_bound_mb(run, steps))
    entry["summary"]["partial"] = entry["steps_reached"] != steps
    results["failures"] += entry["summary"]["failures"]
    if entry["steps_reached"] != steps:
      results["failures"].append(f"{run}: reached step {entry['steps_reached']} of {steps}")
  out = os.path.dirname(os.path.abspath(path))
  write(results, out)
  plot(results, os.path.join(out, "soak.png"))
  _print(results)
  return 1 if results["failures"] else 0


def replot(path):
  """The plot of a soak.json drawn again beside it (soak.png), from its
  curves as they are: nothing is run, checked or rewritten."""
  with open(path) as f:
    results = json.load(f)
  plot(results, os.path.join(os.path.dirname(os.path.abspath(path)), "soak.png"))
  return 0


def _print(results):
  for run, entry in results["runs"].items():
    s = entry.get("summary", {})
    if "warmup_step" not in s:
      print(f"{run}: {entry['steps_reached']} steps, no summary")
      continue
    print(
      f"{run}: {s['end_step']} steps in {entry['wall_s']:.0f} s; RSS {s['rss_mb_at_warmup']:.1f} MB "
      f"at step {s['warmup_step']}, {s['rss_mb_at_end']:.1f} MB at the end, "
      f"max growth {s['rss_max_growth_mb']:.1f} MB (bound {s['bounds']['rss_max_growth_mb']:.1f}); "
      f"fds {s['fds_at_warmup']} -> {s['fds_at_end']}; threads {s['threads_at_warmup']} -> "
      f"{s['threads_at_end']}; copies {s['copies_at_warmup']} -> {s['copies_at_end']}"
    )
  for failure in results["failures"]:
    print("FAILED:", failure)
  if not results["failures"]:
    print("every bound holds")


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("--steps", type=int, default=100_000, help="MLP training steps per run")
  parser.add_argument(
    "--td3-steps", type=int, default=None, help="TD3 environment steps (default: --steps)"
  )
  parser.add_argument("--sample-every", type=int, default=None, help="MLP steps between samples")
  parser.add_argument("--td3-sample-every", type=int, default=None)
  parser.add_argument("--td3-start-steps", type=int, default=1000)
  parser.add_argument("--threads", type=int, default=1, help="threads for each framework's kernels")
  parser.add_argument(
    "--runs", default=",".join(RUNS), help="comma-separated, of " + ", ".join(RUNS)
  )
  parser.add_argument("--parallel", action="store_true", help="the runs at the same time")
  parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
  parser.add_argument(
    "--check", metavar="SOAK_JSON", help="evaluate the bounds again over a soak.json's curves"
  )
  parser.add_argument(
    "--plot", metavar="SOAK_JSON", help="draw a soak.json's soak.png again, running nothing"
  )
  parser.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
  parser.add_argument("--partial", help=argparse.SUPPRESS)
  parser.add_argument("--td3-dir", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.check:
    return recheck(args.check)
  if args.plot:
    return replot(args.plot)
  args.td3_steps = args.td3_steps or args.steps
  # About 100 samples per run, at least every 1,000 steps on a full run.
  args.sample_every = args.sample_every or max(1, min(1000, args.steps // 100))
  args.td3_sample_every = args.td3_sample_every or max(1, min(1000, args.td3_steps // 100))
  if args.child:
    import torch  # noqa: F401  (before TensorFlow)

    if args.child == "td3":
      return run_td3(
        args.steps,
        args.sample_every,
        args.threads,
        args.td3_start_steps,
        args.partial,
        args.td3_dir,
      )
    return run_mlp(args.child[4:], args.steps, args.sample_every, args.threads, args.partial)
  args.runs = [r for r in args.runs.split(",") if r]
  unknown = set(args.runs) - set(RUNS)
  if unknown:
    parser.error(f"--runs: unknown {sorted(unknown)}; expected some of {', '.join(RUNS)}")
  return soak(args)


if __name__ == "__main__":
  sys.exit(main())
