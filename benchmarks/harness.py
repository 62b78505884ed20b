"""Interleaved timing: warm up, repeat, medians and spread."""

import os
import platform
import time

import numpy as np
import tensorflow as tf
import torch


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
      cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  return {
      "python": platform.python_version(),
      "torch": torch.__version__,
      "tensorflow": tf.__version__,
      "numpy": np.__version__,
      "cpu": cpu,
      "cpu_count": os.cpu_count(),
      "threads": {"torch_intra": torch.get_num_threads(),
                  "torch_inter": torch.get_num_interop_threads(),
                  "tf_intra": tf.config.threading.get_intra_op_parallelism_threads(),
                  "tf_inter": tf.config.threading.get_inter_op_parallelism_threads(),
                  "requested": n_threads},
      "device": device,
      "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
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
    order = names[r % len(names):] + names[:r % len(names)]
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
  return {"median_us": float(np.median(s)),
          "p25_us": float(np.percentile(s, 25)),
          "p75_us": float(np.percentile(s, 75)),
          "samples_us": [float(v) for v in s]}
