"""benchmarks/translate_bench.py measures what it says, and its report holds.

Usage:
  .venv/bin/python -m pytest -q tests/test_translate_bench.py

The orchestration runs end to end with a runner that measures every
contender of both kinds in this process (one call per timing); the first
call of each is kept and checked against the bridge's: the translated
module, its XLA versions, Keras with the torch weights and pure torch
compute the bridge's outputs and first loss, so the benchmark compares the
same computation. The translated training step trains the bridge's own
variables, and one contender process runs through the CLI.
"""

import json
import os

import torch  # before TensorFlow
import numpy as np
import pytest
import tensorflow as tf

from benchmarks import harness
from benchmarks import translate_bench as tbb

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = [pytest.mark.slow, pytest.mark.one_pass]


def test_run_measures_the_same_computation_and_reports_ratios(tmp_path):
  first = {}

  def in_this_process(kind, contender, models_, repeats):
    outputs = {}
    record = tbb.record(kind, contender, models_, repeats=repeats, calls=1, first_outputs=outputs)
    first.update({(key, contender): v for key, v in outputs.items()})
    record.update(foreign_load_cores=0.0, waited_s=0.0, wall_s=0.0, attempts=1)
    return record

  results = tbb.run(
    quick=True,
    threads=2,
    repeats=2,
    models_=("small_mlp", "td3_actor"),
    runner=in_this_process,
    log=lambda m: None,
  )
  infer_keys = {tbb.infer_key(m, b) for m in ("small_mlp", "td3_actor") for b in tbb.BATCHES}
  keys = infer_keys | {tbb.train_key()}

  # Every contender computes the bridge's outputs (and first loss).
  for key in keys:
    kind = "train" if key == tbb.train_key() else "infer"
    want = first[key, tbb.BRIDGE]
    assert np.abs(want).max() > 1e-3  # not a degenerate comparison
    if kind == "infer":
      batch = int(key.rsplit(" ", 1)[1])
      assert want.shape == (batch, 8 if "small_mlp" in key else 1)
    for contender in tbb.CONTENDERS_OF[kind]:
      np.testing.assert_allclose(
        first[key, contender], want, rtol=1e-5, atol=1e-5, err_msg=f"{key}: {contender}"
      )

  path = tbb.write(results, str(tmp_path))
  with open(path) as f:
    loaded = json.load(f)
  assert loaded["rounds"] == 1 and loaded["repeats"] == 2
  assert set(loaded["timings"]) == keys == set(loaded["ratios"])
  for key in keys:
    kind = "train" if key == tbb.train_key() else "infer"
    assert set(loaded["timings"][key]) == set(tbb.CONTENDERS_OF[kind])
    bridge = loaded["timings"][key][tbb.BRIDGE]["median_us"]
    keras = loaded["timings"][key][tbb.KERAS]["median_us"]
    for contender, t in loaded["timings"][key].items():
      assert t["median_us"] > 0 and len(t["processes"]) == 1
      assert len(t["processes"][0]["samples_us"]) == 2
      r = loaded["ratios"][key][contender]
      assert r["/ bridge"] == pytest.approx(t["median_us"] / bridge)
      assert r["/ keras"] == pytest.approx(t["median_us"] / keras)
    assert loaded["ratios"][key][tbb.BRIDGE]["/ bridge"] == 1.0
  env = loaded["environment"]
  assert env["torch"] == torch.__version__ and env["tensorflow"] == tf.__version__
  assert loaded["foreign_load_cores"] == {"median": 0.0, "max": 0.0}
  table = (tmp_path / "translate_bench.md").read_text()
  for contender in tbb.CONTENDERS_OF["train"]:
    assert f"| {tbb.train_key()} | {contender} |" in table


def test_translated_step_trains_the_bridge_variables():
  """The translated contender's step updates the TorchModule's variables
  (the translation reads them; nothing is copied)."""
  x_np, y_np = tbb._train_data("small_mlp")
  bridged = tbb.tb.TorchModule(tbb._torch_model("small_mlp"), name="bridged")
  served = tbb._translate(bridged, "small_mlp")
  assert [id(v) for v in served.trainable_variables] == [id(v) for v in bridged.trainable_variables]
  before = [v.numpy() for v in bridged.trainable_variables]
  step = tf.function(tbb.train_step._tf_step(served, tf.constant(x_np), tf.constant(y_np)))
  step()
  after = [v.numpy() for v in bridged.trainable_variables]
  assert all(np.abs(a - b).max() > 0 for a, b in zip(after, before))
  x = tf.constant(x_np)
  np.testing.assert_allclose(served(x).numpy(), bridged(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_contender_process_prints_its_record():
  record = harness.run_process(
    "benchmarks.translate_bench",
    [
      "--process",
      "infer",
      tbb.PURE_TORCH,
      "--models",
      "td3_actor",
      "--calls",
      1,
      "--repeats",
      1,
      "--threads",
      1,
    ],
    quiet_wait=0,
    retries=0,
    timeout=120,
  )
  assert record["contender"] == tbb.PURE_TORCH and record["kind"] == "infer"
  assert record["pid"] != os.getpid()
  assert record["threads"] == {"torch_intra": 1, "tf_intra": 1}
  assert set(record["timings"]) == {tbb.infer_key("td3_actor", b) for b in tbb.BATCHES}
  assert record["native"] == tbb._loader.available()
