"""MultiWorkerMirroredStrategy: two local worker processes on loopback.

The test starts both workers (tests/_multi_worker.py) with their TF_CONFIG,
waits for them, and always stops them, also when it fails. Each worker
trains on its half of the batch; both must end with the weights of
single-process training on the whole batch (float64, 1e-9).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import torchbridge as tb

sys.path.insert(0, str(Path(__file__).parent))
import _multi_worker  # noqa: E402

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = pytest.mark.slow

WORKER_SCRIPT = Path(__file__).with_name("_multi_worker.py")
TIMEOUT_S = 300


def _free_ports(n):
  sockets = [socket.socket() for _ in range(n)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def _single_process_weights(wrap):
  module = tb.TorchModule(_multi_worker.mlp(), name="net")
  optimizer = tf.keras.optimizers.Adam(0.01)
  optimizer.build(module.trainable_variables)
  step = wrap(_multi_worker.make_step(module, optimizer))
  x, y = _multi_worker.data()
  for _ in range(_multi_worker.STEPS):
    step(tf.constant(x), tf.constant(y))
  return module.get_weights()


@pytest.fixture
def two_workers(tmp_path):
  """Starts the two workers; yields their output paths; always stops them."""
  ports = _free_ports(2)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  procs, outs = [], []
  try:
    for index in range(2):
      env = dict(os.environ)
      env["TF_CONFIG"] = json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}
      )
      env["TF_CPP_MIN_LOG_LEVEL"] = "2"
      out = tmp_path / f"worker{index}.npz"
      with open(tmp_path / f"worker{index}.log", "w") as log:
        procs.append(
          subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), str(out)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(tmp_path),
          )
        )
      outs.append(out)
    yield procs, outs, tmp_path
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
      proc.wait()


def test_two_workers_match_single_process(two_workers):
  procs, outs, log_dir = two_workers
  for index, proc in enumerate(procs):
    try:
      code = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
      code = "timeout"
    log = (log_dir / f"worker{index}.log").read_text()[-3000:]
    assert code == 0, f"worker {index} ended with {code}:\n{log}"

  results = [np.load(out) for out in outs]
  for mode, wrap in (("eager", lambda fn: fn), ("function", tf.function)):
    expected = _single_process_weights(wrap)
    for name, value in expected.items():
      for worker, result in enumerate(results):
        np.testing.assert_allclose(
          result[f"{mode}/{name}"],
          value,
          rtol=1e-9,
          atol=1e-9,
          err_msg=f"{mode}, worker {worker}, {name}",
        )
      # The workers hold identical copies.
      np.testing.assert_array_equal(results[0][f"{mode}/{name}"], results[1][f"{mode}/{name}"])
  # Training moved the weights.
  initial = _multi_worker.mlp()[0].weight.detach().numpy()
  assert not np.allclose(results[0]["function/0.weight"], initial)
