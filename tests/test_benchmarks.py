"""The benchmark suite's quick mode runs end to end, so it cannot rot."""

import json
import os
import subprocess
import sys

import torch  # before TensorFlow
import numpy as np
import tensorflow as tf

import torchbridge as tb
from benchmarks import numpy_bridge

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_run_writes_table_json_targets_and_plots(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert out.returncode == 0, out.stdout + out.stderr
  assert "targets:" in out.stdout and "training step, small_mlp" in out.stdout
  results = json.loads((tmp_path / "latest.json").read_text())
  env = results["environment"]
  assert env["torch"] == torch.__version__ and env["tensorflow"] == tf.__version__
  assert env["threads"]["torch_intra"] == env["threads"]["tf_intra"]
  for name in ("torchbridge tf.function", "keras tf.function", "pure torch",
               "numpy-copy bridge tf.function"):
    t = results["train_steps"]["small_mlp"][name]
    assert t["p25_us"] <= t["median_us"] <= t["p75_us"]
  names = {t["name"] for t in results["targets"]}
  assert "exchange bytes copied (torchbridge, all sizes)" in names
  assert ("bridge's own overhead per call in tf.function, tf.py_function "
          "path (us over a bare tf.py_function)") in names
  if tb.native_available():
    assert ("bridge's own overhead per call in tf.function, native op (us "
            "over a bare native op)") in names
    assert "torchbridge tf.function (tf.py_function path)" in \
        results["train_steps"]["small_mlp"]
  for target in results["targets"]:
    assert set(target) == {"name", "measured", "limit", "met"}
    assert isinstance(target["met"], bool)
  bytes_copied = {k: v["bytes_copied"] for k, v in results["exchange"].items()}
  assert all(b["torchbridge"] == 0 for b in bytes_copied.values())
  assert bytes_copied["16MB"]["numpy_copy"] == 2 * (16 << 20)
  assert (tmp_path / "exchange.png").stat().st_size > 1000
  assert (tmp_path / "train_steps.png").stat().st_size > 1000


def test_numpy_bridge_baseline_computes_the_same_gradients():
  # The baseline must be a faithful bridge, not a strawman: same outputs
  # and gradients as torchbridge for the same torch module.
  torch.manual_seed(0)
  module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 2)).double()
  copied = numpy_bridge.NumpyBridgeModule(module)
  bridged = tb.TorchModule(module)
  x = tf.constant(np.random.default_rng(0).standard_normal((5, 4)))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x)
    y_copied, y_bridged = copied(x), bridged(x)
    loss_copied = tf.reduce_sum(y_copied ** 2)
    loss_bridged = tf.reduce_sum(y_bridged ** 2)
  np.testing.assert_allclose(y_copied.numpy(), y_bridged.numpy(), rtol=1e-12)
  np.testing.assert_allclose(tape.gradient(loss_copied, x).numpy(),
                             tape.gradient(loss_bridged, x).numpy(), rtol=1e-12)
  grads_copied = tape.gradient(loss_copied, copied.trainable_variables)
  grads_bridged = dict(zip([v.name.split("/", 1)[1].split(":")[0]
                            for v in bridged.trainable_variables],
                           tape.gradient(loss_bridged, bridged.trainable_variables)))
  for name, g in zip([n for n, _ in module.named_parameters()], grads_copied):
    np.testing.assert_allclose(g.numpy(), grads_bridged[name].numpy(), rtol=1e-12)


def test_numpy_round_trip_copies_every_byte_and_torchbridge_none():
  x = tf.random.uniform([1024])
  assert numpy_bridge.bytes_copied_by_round_trip(x) == 2 * 4096
  y = numpy_bridge.exchange_round_trip(x)
  np.testing.assert_array_equal(y.numpy(), x.numpy())
  tb.reset_exchange_stats()
  z = tb.to_tf(tb.to_torch(x))
  assert tb.exchange_stats() == {"zero_copy": 2, "copied": 0, "bytes_copied": 0}
  assert tb.to_torch(z).data_ptr() == tb.to_torch(x).data_ptr()
