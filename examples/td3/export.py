"""The trained actor served without torch: `tb.translate`, a SavedModel, a
process in which torch cannot be imported.

`export_actor` translates the bridged actor into pure TF ops that read the
same variables TF's optimizer trained, saves it as a SavedModel, runs
`serve_actor.py` on it in a fresh process that refuses `import torch`, and
compares that process's actions with the bridge's on the same observations.
"""

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import torchbridge as tb

SERVE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "serve_actor.py")


def export_actor(actor, obs_dim, out_dir, seed=0, n_obs=64):
  """Returns a dict: the SavedModel path, parity, and the served/bridge match."""
  served = tb.translate(actor, input_signature=[tf.TensorSpec([None, obs_dim], tf.float32)])
  path = os.path.join(out_dir, "actor_savedmodel")
  tf.saved_model.save(served, path)
  obs = np.random.default_rng(seed).uniform(-1, 1, (n_obs, obs_dim)).astype(np.float32)
  obs_path = os.path.join(out_dir, "serve_obs.npy")
  np.save(obs_path, obs)
  result = subprocess.run(
    [sys.executable, SERVE, path, obs_path], capture_output=True, text=True, timeout=300
  )
  if result.returncode != 0:
    raise RuntimeError(f"serving the SavedModel without torch failed:\n{result.stderr[-3000:]}")
  served_process = json.loads(result.stdout.strip().splitlines()[-1])
  actions_served = np.asarray(served_process["actions"], np.float32)
  actions_bridge = actor(tf.constant(obs)).numpy()
  return {
    "savedmodel": path,
    "translation_parity": [float(p) for p in served.parity],
    "torch_importable_in_server": served_process["torch_importable"],
    "max_abs_diff_served_vs_bridge": float(np.max(np.abs(actions_served - actions_bridge))),
    # TF's and torch's matmul kernels round differently: equal within
    # float32 rounding, as translate's own parity check requires.
    "equal": bool(np.allclose(actions_served, actions_bridge, rtol=1e-5, atol=1e-6)),
    "bitwise_equal": bool(np.array_equal(actions_served, actions_bridge)),
    "observations": n_obs,
  }


def summary(export):
  diff = export["max_abs_diff_served_vs_bridge"]
  same = (
    "equal the bridge's to the last bit"
    if export["bitwise_equal"]
    else f"equal the bridge's within float32 rounding (max |diff| {diff:.1e})"
    if export["equal"]
    else f"DIFFER from the bridge's (max |diff| {diff:.1e})"
  )
  return (
    f"  served without torch: {export['savedmodel']} (pure TF ops, "
    f"tb.translate), run in a process where `import torch` fails: "
    f"its actions on {export['observations']} observations {same}"
  )
