"""Saving and loading a `tb.TorchModule`: TF checkpoints (restored in a fresh
process), torch state_dicts, and get_weights / set_weights."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from _module_helpers import BNNet
from _module_helpers import CHECKPOINT_OPTIMIZERS
from _module_helpers import MLP
from _module_helpers import checkpoint_model
from _module_helpers import checkpoint_probe
from _module_helpers import data
from _module_helpers import seeded
from _module_helpers import train_step
from _module_helpers import var

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TESTS_DIR)

FRESH_PROCESS_SCRIPT = """\
import sys
import numpy as np
import torch  # before tensorflow
import tensorflow as tf
sys.path.insert(0, {tests_dir!r})
from _module_helpers import checkpoint_model, checkpoint_probe


# Another seed: another random init, which the restore must overwrite.
actor, opt = checkpoint_model({opt_name!r}, seed=1234)
np.savez({before_path!r}, **actor.get_weights())
opt.build(actor.trainable_variables)  # the slots the checkpoint fills
ckpt = tf.train.Checkpoint(actor=actor, optimizer=opt)
manager = tf.train.CheckpointManager(ckpt, {ckpt_dir!r}, max_to_keep=2)
ckpt.restore(manager.latest_checkpoint).assert_consumed()
np.savez({out_path!r}, **checkpoint_probe(actor, opt))
print("restored", manager.latest_checkpoint)
"""


# Variables and slots through a file and a new process: the same on both
# paths (its graph calls take the default TF runner), so the native pass only.
@pytest.mark.one_pass
@pytest.mark.slow  # a fresh process per optimizer (~22 s): make test-long
@pytest.mark.parametrize("opt_name", CHECKPOINT_OPTIMIZERS)
def test_checkpoint_restores_in_a_fresh_process_exactly(tmp_path, opt_name):
  actor, opt = checkpoint_model(opt_name, seed=0)
  step = train_step(actor, opt)
  for s in range(3):
    step(tf.constant(data([8, 3], seed=s)), tf.constant(data([8, 2], seed=9)))
  ckpt_dir = str(tmp_path / "ckpt")
  ckpt = tf.train.Checkpoint(actor=actor, optimizer=opt)
  manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=2)
  path = manager.save()
  saved_state = actor.get_weights()
  assert saved_state["bn.num_batches_tracked"] == 3

  # The checkpoint holds parameters, buffers and optimizer slots.
  stored = dict(tf.train.list_variables(path))
  for n, w in saved_state.items():
    matches = [
      k
      for k in stored
      if k.startswith("actor/")
      and k.endswith("/.ATTRIBUTES/VARIABLE_VALUE")
      and n.replace(".", "..") in k
    ]
    assert len(matches) == 1, (n, sorted(stored))
    np.testing.assert_array_equal(tf.train.load_variable(path, matches[0]), w)
  n_params = len(actor.trainable_variables)
  slots = [k for k in stored if k.startswith("optimizer/_variables/")]
  assert len(slots) >= 2 * n_params, sorted(stored)  # Adam's m and v

  want = checkpoint_probe(actor, opt)  # what the restored copy must give

  script = tmp_path / "restore.py"
  before_path, out_path = str(tmp_path / "before.npz"), str(tmp_path / "out.npz")
  script.write_text(
    FRESH_PROCESS_SCRIPT.format(
      tests_dir=TESTS_DIR,
      opt_name=opt_name,
      ckpt_dir=ckpt_dir,
      before_path=before_path,
      out_path=out_path,
    )
  )
  proc = subprocess.run(
    [sys.executable, str(script)], cwd=REPO_DIR, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
  assert "restored" in proc.stdout

  before = np.load(before_path)
  assert not np.array_equal(before["l1.weight"], saved_state["l1.weight"])
  got = np.load(out_path)
  assert sorted(got.files) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  assert got["iterations"] == 4
  assert got["after/bn.num_batches_tracked"] == 4


def test_checkpoint_restore_in_process_reaches_traced_functions(tmp_path):
  """A restore is seen by the next call of an already traced tf.function."""
  actor = tb.TorchModule(seeded(0, BNNet), name="actor")
  ckpt = tf.train.Checkpoint(actor=actor)
  path = ckpt.save(str(tmp_path / "ck"))
  x = tf.constant(data([6, 3]))
  call = tf.function(lambda x: actor(x, training=False))
  want = call(x).numpy()
  for v in actor.variables:
    v.assign(v + tf.ones_like(v))
  assert not np.array_equal(call(x).numpy(), want)
  ckpt.restore(path).assert_consumed()
  np.testing.assert_array_equal(call(x).numpy(), want)


# ------------------------------------------------------ torch stays usable


def _trained_bn_actor():
  actor = tb.TorchModule(seeded(0, BNNet), name="actor")
  opt = tf.keras.optimizers.Adam(0.05)
  step = train_step(actor, opt)
  for s in range(3):
    step(tf.constant(data([8, 3], seed=s)), tf.constant(data([8, 2], seed=9)))
  return actor


def test_torch_module_holds_the_tf_trained_values(tmp_path):
  actor = _trained_bn_actor()
  initial = seeded(0, BNNet).state_dict()
  module = actor.torch_module
  state = {n: t.clone() for n, t in module.state_dict().items()}
  weights = actor.get_weights()
  assert sorted(state) == sorted(weights)
  for n, t in state.items():
    np.testing.assert_array_equal(t.numpy(), weights[n], err_msg=n)
    if n != "bn.num_batches_tracked":
      assert not torch.equal(t, initial[n]), n
  assert int(state["bn.num_batches_tracked"]) == 3
  # Saved by torch, loaded into a fresh torch module: the same function.
  path = tmp_path / "actor.pt"
  torch.save(actor.torch_module.state_dict(), path)
  fresh = seeded(5, BNNet)
  fresh.load_state_dict(torch.load(path))
  fresh.eval()
  x = data([6, 3], seed=4)
  with torch.no_grad():
    want = fresh(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(
    actor(tf.constant(x), training=False).numpy(), want, rtol=1e-6, atol=1e-7
  )
  # Training goes on after the torch module was read.
  step = train_step(actor, tf.keras.optimizers.SGD(0.1))
  step(tf.constant(x), tf.constant(data([6, 2], seed=9)))
  assert not np.array_equal(
    actor.torch_module.l1.weight.detach().numpy(), state["l1.weight"].numpy()
  )
  np.testing.assert_array_equal(
    actor.torch_module.l1.weight.detach().numpy(), var(actor, "l1.weight").numpy()
  )


def test_torch_state_dict_file_loads_into_a_torch_module(tmp_path):
  source = seeded(3, BNNet)
  source.train()
  with torch.no_grad():
    source(torch.from_numpy(data([8, 3])))  # non-trivial running stats
  path = tmp_path / "source.pt"
  torch.save(source.state_dict(), path)
  actor = tb.TorchModule(seeded(0, BNNet), name="actor")
  actor.set_weights(torch.load(path))
  for n, t in source.state_dict().items():
    np.testing.assert_array_equal(actor.get_weights()[n], t.numpy(), err_msg=n)
  assert actor.get_weights()["bn.num_batches_tracked"] == 1
  source.eval()
  x = data([6, 3], seed=4)
  with torch.no_grad():
    want = source(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(
    actor(tf.constant(x), training=False).numpy(), want, rtol=1e-6, atol=1e-7
  )


def test_get_weights_set_weights_round_trip():
  # A graph call compared bit for bit with an eager one: both torch.
  a = tb.TorchModule(seeded(0, MLP), name="a", run="torch")
  b = tb.TorchModule(seeded(1, MLP), name="b", run="torch")
  x = tf.constant(data([5, 4]))
  call_b = tf.function(lambda x: b(x))
  assert not np.allclose(call_b(x).numpy(), a(x).numpy())
  weights = a.get_weights()
  assert sorted(weights) == sorted(seeded(0, MLP).state_dict())
  assert all(isinstance(w, np.ndarray) for w in weights.values())
  b.set_weights(weights)
  # Seen by an already traced function too: the variables are the truth.
  np.testing.assert_array_equal(call_b(x).numpy(), a(x).numpy())
  for n, w in b.get_weights().items():
    np.testing.assert_array_equal(w, weights[n])
  # get_weights gives copies: changing them changes nothing.
  weights["head.bias"] += 1
  np.testing.assert_array_equal(call_b(x).numpy(), a(x).numpy())


def test_set_weights_accepts_tensors_and_casts_to_the_variable_dtype():
  actor = tb.TorchModule(seeded(0, torch.nn.Linear, 3, 2), name="lin")
  w = np.arange(6, dtype=np.float64).reshape(2, 3) / 7
  actor.set_weights({"weight": tf.constant(w), "bias": torch.ones(2)})
  assert var(actor, "weight").dtype == tf.float32
  np.testing.assert_array_equal(var(actor, "weight").numpy(), w.astype(np.float32))
  np.testing.assert_array_equal(var(actor, "bias").numpy(), np.ones(2))


# --------------------------------------------------- set_weights is strict


def _assert_unchanged(actor, before):
  after = actor.get_weights()
  assert sorted(after) == sorted(before)
  for n in before:
    np.testing.assert_array_equal(after[n], before[n], err_msg=n)


@pytest.mark.parametrize("problem", ["missing", "extra", "shape", "all"])
def test_set_weights_rejects_bad_entries_naming_them_and_changes_nothing(problem):
  actor = tb.TorchModule(seeded(0, BNNet), name="actor")
  before = actor.get_weights()
  x = tf.constant(data([4, 3]))
  out_before = actor(x, training=False).numpy()
  weights = {n: w + 1 for n, w in seeded(1, BNNet).state_dict().items()}
  weights = {n: w.numpy() for n, w in weights.items()}
  expected = []
  if problem in ("missing", "all"):
    del weights["bn.running_var"], weights["l2.bias"]
    expected += [r"missing names: \['bn.running_var', 'l2.bias'\]"]
  if problem in ("extra", "all"):
    weights["l3.weight"] = np.zeros([2, 2], np.float32)
    weights["encoder.bias"] = np.zeros([2], np.float32)
    expected += [r"unexpected names: \['encoder.bias', 'l3.weight'\]"]
  if problem in ("shape", "all"):
    weights["l1.weight"] = np.zeros([3, 5], np.float32)
    expected += [r"'l1.weight' has shape \(3, 5\), expected \(5, 3\)"]
  with pytest.raises(ValueError) as info:
    actor.set_weights(weights)
  message = str(info.value)
  for pattern in expected:
    assert re.search(pattern, message), (pattern, message)
  assert "actor.set_weights()" in message
  # The valid entries were not applied either.
  _assert_unchanged(actor, before)
  np.testing.assert_array_equal(actor(x, training=False).numpy(), out_before)


@pytest.mark.parametrize("bad", ["list", "strings"])
def test_set_weights_rejects_non_mappings_and_non_numbers(bad):
  actor = tb.TorchModule(seeded(0, torch.nn.Linear, 3, 2), name="lin")
  before = actor.get_weights()
  if bad == "list":
    weights, match = [np.zeros([2, 3]), np.zeros([2])], r"expects a mapping"
  else:
    weights = {"weight": np.zeros([2, 3]), "bias": np.array(["a", "b"])}
    match = r"entry 'bias' has dtype <U1, expected numeric"
  with pytest.raises(TypeError, match=match):
    actor.set_weights(weights)
  _assert_unchanged(actor, before)


def test_state_dict_names_and_shapes_match_torch_exactly():
  net = seeded(0, BNNet)
  actor = tb.TorchModule(net, name="actor")
  weights = actor.get_weights()
  state = net.state_dict()
  assert list(sorted(weights)) == list(sorted(state))
  for n, t in state.items():
    assert weights[n].shape == tuple(t.shape)
    assert weights[n].dtype == t.numpy().dtype


def test_saved_model_of_a_module_that_writes_buffers_fails_in_save(tmp_path):
  # docs/limitations.md: such a graph call holds a tf.CriticalSection (see
  # docs/reliability.md), which a SavedModel cannot track; the save fails
  # at once rather than leaving a model that fails when called.
  net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
  holder = tf.Module()
  holder.net = tb.TorchModule(net, name="bn")
  holder.step = tf.function(
    lambda x: holder.net(x, training=True), input_signature=[tf.TensorSpec([4, 3])]
  )
  holder.step(tf.ones([4, 3]))
  with pytest.raises(AssertionError, match="untracked.*resource"):
    tf.saved_model.save(holder, str(tmp_path / "model"))
