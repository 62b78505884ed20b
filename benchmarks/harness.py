"""Timing: contenders interleaved in one process, or one process each, alternated."""

import contextlib
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Before each benchmark process: wait up to QUIET_MAX_WAIT s for other
# processes to use less than QUIET_CORES cores (the machine is shared), and
# no longer once a run has waited QUIET_BUDGET s in all.
QUIET_MAX_WAIT, QUIET_CORES, QUIET_BUDGET = 15.0, 0.3, 240.0
_waited_in_all = 0.0
# Benchmark processes that failed (and were started again): run_process.
FAILURES = []


def configure_threads(n_threads):
  """Gives both frameworks the same number of threads (before any op runs)."""
  torch.set_num_threads(n_threads)
  torch.set_num_interop_threads(1)
  tf.config.threading.set_intra_op_parallelism_threads(n_threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)


def environment(n_threads, device):
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  return {
    "python": platform.python_version(),
    "torch": torch.__version__,
    "tensorflow": tf.__version__,
    "numpy": np.__version__,
    "cpu": cpu,
    "cpu_count": os.cpu_count(),
    "threads": {
      "torch_intra": torch.get_num_threads(),
      "torch_inter": torch.get_num_interop_threads(),
      "tf_intra": tf.config.threading.get_intra_op_parallelism_threads(),
      "tf_inter": tf.config.threading.get_inter_op_parallelism_threads(),
      "requested": n_threads,
    },
    "device": device,
    "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
    "source": _source(),
  }


def _source():
  """The commit measured, and the bridge's files changed since (if any)."""

  def git(*args):
    try:
      return subprocess.run(
        ["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=30
      ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
      return None

  changed = git("status", "--porcelain", "--", "torchbridge", "csrc")
  return {
    "commit": git("rev-parse", "HEAD"),
    "changed_since": changed.splitlines() if changed else [],
  }


def interleaved(contenders, repeats, calls, warmup, sync=None):
  """Times each contender `calls` times per repeat, interleaving them.

  Args:
    contenders: {name: zero-argument callable}.
    repeats: number of rounds; each round times every contender once, in an
      order that rotates from round to round.
    calls: calls per timing (the per-call time is the total / calls), an
      int or {name: int}.
    warmup: untimed calls per contender before the first round.
    sync: optional callable run after each timing (a device sync).

  Returns:
    {name: {"median_us", "p25_us", "p75_us", "samples_us"}}.
  """
  names = list(contenders)
  if isinstance(calls, int):
    calls = {name: calls for name in names}
  for name in names:
    for _ in range(warmup):
      contenders[name]()
  if sync:
    sync()
  samples = {name: [] for name in names}
  for r in range(repeats):
    order = names[r % len(names) :] + names[: r % len(names)]
    for name in order:
      fn = contenders[name]
      start = time.perf_counter()
      for _ in range(calls[name]):
        fn()
      if sync:
        sync()
      samples[name].append((time.perf_counter() - start) / calls[name] * 1e6)
  return {name: summarize(s) for name, s in samples.items()}


def summarize(samples_us):
  s = np.asarray(samples_us)
  return {
    "median_us": float(np.median(s)),
    "p25_us": float(np.percentile(s, 25)),
    "p75_us": float(np.percentile(s, 75)),
    "samples_us": [float(v) for v in s],
  }


def timed_repeats(fn, repeats, calls, sync=None):
  """Per-call times (us) of `repeats` timings of `calls` calls each."""
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(calls):
      fn()
    if sync:
      sync()
    samples.append((time.perf_counter() - start) / calls * 1e6)
  return samples


def calls_for(fn, seconds, min_warmup=2, sync=None):
  """Warms `fn` up for about `seconds` (at least `min_warmup` calls after the
  first, which may trace) and returns how many calls take about `seconds`."""
  fn()
  if sync:
    sync()
  n, start = 0, time.perf_counter()
  while n < min_warmup or time.perf_counter() - start < seconds:
    fn()
    n += 1
  if sync:
    sync()
  per_call = (time.perf_counter() - start) / n
  return max(1, round(seconds / per_call))


def _busy_seconds():
  """CPU seconds the whole machine has been busy (all cores, /proc/stat;
  steal time included: on a VM, a neighbour's use is noise too)."""
  with open("/proc/stat") as f:
    fields = [int(v) for v in f.readline().split()[1:]]
  user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
  return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


def _children_cpu_seconds():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def wait_for_quiet(max_wait=QUIET_MAX_WAIT, threshold=QUIET_CORES):
  """Waits (up to `max_wait` s, within what is left of QUIET_BUDGET) until
  other processes use less than `threshold` cores over half a second;
  returns the seconds waited."""
  global _waited_in_all
  max_wait = min(max_wait, QUIET_BUDGET - _waited_in_all)
  start = time.perf_counter()
  while max_wait > 0:
    busy = _busy_seconds()
    time.sleep(0.5)
    load = (_busy_seconds() - busy) / 0.5
    if load < threshold or time.perf_counter() - start >= max_wait:
      break
  waited = time.perf_counter() - start
  _waited_in_all += waited
  return waited


def run_process(
  module, args, timeout=900, quiet_wait=QUIET_MAX_WAIT, retries=2, python=None, path=None
):
  """Runs `python -m module *args` in a fresh process (from the repository
  root; given `python`, that interpreter with `-P`, from the temporary
  directory, with only `path` on PYTHONPATH: the packages it imports are its
  venv's) and returns the JSON object on the last line of its output, with
  "foreign_load_cores": the cores other processes kept busy meanwhile, on
  average (this machine is shared: the figure says how quiet a run was),
  and "waited_s" (for a quiet machine, before starting; see wait_for_quiet).

  A process that fails (a crash included) is recorded in `FAILURES` and
  started again, up to `retries` times; then the error is raised.
  """
  for attempt in range(retries + 1):
    waited = wait_for_quiet(quiet_wait) if quiet_wait else 0.0
    busy, children = _busy_seconds(), _children_cpu_seconds()
    start = time.perf_counter()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    interpreter = [sys.executable]
    if python is not None:
      interpreter = [python, "-P"]
      env["PYTHONPATH"] = path or ""
    out = subprocess.run(
      [*interpreter, "-m", module, *[str(a) for a in args]],
      cwd=ROOT if python is None else tempfile.gettempdir(),
      capture_output=True,
      text=True,
      timeout=timeout,
      env=env,
    )
    wall = time.perf_counter() - start
    own = _children_cpu_seconds() - children
    foreign = max(0.0, (_busy_seconds() - busy - own) / wall)
    if out.returncode == 0:
      break
    command = f"{python or 'python'} -m {module} {' '.join(map(str, args))}"
    FAILURES.append(
      {
        "command": command,
        "returncode": out.returncode,
        "attempt": attempt + 1,
        "stderr_tail": out.stderr[-2000:],
      }
    )
    if attempt == retries:
      raise RuntimeError(f"{command} failed ({out.returncode}):\n{out.stderr[-3000:]}")
  record = json.loads(out.stdout.strip().splitlines()[-1])
  record.update(
    foreign_load_cores=round(foreign, 3),
    waited_s=round(waited, 1),
    wall_s=round(wall, 1),
    attempts=attempt + 1,
  )
  return record


@contextlib.contextmanager
def benchmarks_only_path():
  """A directory holding only links to benchmarks/ and examples/: on
  PYTHONPATH (`run_process(..., python=, path=)`), a venv's process
  imports these from the checkout and torchbridge from its own venv."""
  with tempfile.TemporaryDirectory(prefix="benchmarks_path_") as path:
    for name in ("benchmarks", "examples"):
      os.symlink(os.path.join(ROOT, name), os.path.join(path, name))
    yield path


def alternated(jobs, rounds, log=None):
  """Runs each job once per round, rounds one after another, the order
  rotating from round to round (each job typically starts a process).

  Args:
    jobs: {name: zero-argument callable returning a dict}.
    rounds: number of rounds.
    log: optional callable(str) told about each job as it starts.

  Returns:
    {name: [result of round 0, round 1, ...]}.
  """
  names = list(jobs)
  results = {name: [] for name in names}
  for r in range(rounds):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      if log:
        log(f"round {r + 1}/{rounds}: {name}")
      results[name].append(jobs[name]())
  return results


def over_processes(records, key="median_us"):
  """The median over processes of each process's `key`, with its spread.

  Returns:
    {key: median over processes, "min", "max", "spread" ((max - min) /
    median), "processes": the records, in round order}.
  """
  values = np.asarray([r[key] for r in records], dtype=float)
  median = float(np.median(values))
  return {
    key: median,
    "min": float(values.min()),
    "max": float(values.max()),
    "spread": float((values.max() - values.min()) / median),
    "processes": records,
  }


def write_results(out_dir, stem, data, text):
  """Writes a benchmark's committed pair, `stem.json` (its data) and
  `stem.md` (its table, `text`), into `out_dir` (made if missing), and
  prints the table."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
  (out / f"{stem}.md").write_text(text)
  print(text)
