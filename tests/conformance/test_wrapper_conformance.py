"""Conformance: one set of tests that every public wrapper must pass.

Each case runs on every wrapper of `_conformance_wrappers.WRAPPERS`
(`tb.TorchModule`, `tb.keras.TorchLayer`), on a small torch model with
parameters, BatchNorm buffers (running statistics and the int64
`num_batches_tracked`) and an int64 counter buffer that the forward writes in
training mode. Cases that take `in_mode` run eagerly, in a `tf.function` and in one
compiled by XLA. The reference is always pure torch on a `copy.deepcopy` of the
module made before wrapping (after wrapping, the original module's tensors
are placeholders between bridged calls; the wrapper's state is read through
its variables or `wrapper.torch_module`).

Cases a wrapper is known to fail are listed in its factory's `known_bugs` and
run as strict xfails.
"""

import copy
import gc
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn
import keras
import tensorflow as tf

from _conformance_wrappers import wrappers

IN, HIDDEN, OUT = 4, 8, 3
LR = 0.1
FLOAT_TOL = {"rtol": 1e-6, "atol": 1e-6}
# l1.bias feeds a training-mode BatchNorm, which subtracts the batch mean:
# its gradient is (about) zero, so it is left out of "did it change" checks.
MOVING_PARAMS = ("l1.weight", "bn.weight", "bn.bias", "l2.weight", "l2.bias")
PARAMS = ("l1.weight", "l1.bias", "bn.weight", "bn.bias", "l2.weight", "l2.bias")
BUFFERS = ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "calls")


class BNMLP(nn.Module):
  """Linear -> BatchNorm1d -> tanh -> Linear, and a train-mode call counter."""

  def __init__(self):
    super().__init__()
    self.l1 = nn.Linear(IN, HIDDEN)
    self.bn = nn.BatchNorm1d(HIDDEN)
    self.l2 = nn.Linear(HIDDEN, OUT)
    self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

  def forward(self, x):
    if self.training:
      self.calls += 1
    return self.l2(torch.tanh(self.bn(self.l1(x))))


def make_net(seed):
  """A BNMLP whose every parameter and buffer depends on `seed`."""
  torch.manual_seed(seed)
  net = BNMLP()
  with torch.no_grad():
    net.bn.weight.uniform_(0.5, 1.5)
    net.bn.bias.uniform_(-0.5, 0.5)
    net.bn.running_mean.uniform_(-0.5, 0.5)
    net.bn.running_var.uniform_(0.5, 1.5)
    net.bn.num_batches_tracked.fill_(3 + 7 * seed)
    net.calls.fill_(10 * seed + 1)
  return net


@pytest.fixture(params=["eager", "function", "xla"])
def mode(request):
  """Eagerly, in a `tf.function`, and in one compiled by XLA
  (`jit_compile=True`: the default runner's TF ops compiled, the torch
  runners' calls as torchbridge's XLA custom call); a torch runner is
  skipped under XLA where that custom call cannot be had."""
  factory = request.node.callspec.params.get("factory")
  if request.param == "xla" and factory is not None and factory.runner != "default":
    from torchbridge._native import _xla  # pylint: disable=import-outside-toplevel

    if not _xla.jit_usable():
      pytest.skip(f"torch inside XLA is unavailable here: {_xla.unavailable() or 'a GPU'}")
  return request.param


def wrapped(factory, seed=0):
  """(wrapper, pure-torch copy made before wrapping)."""
  net = make_net(seed)
  reference = copy.deepcopy(net)
  return factory.wrap(net, "net"), reference


def data(batch, seed=0):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(batch, IN)).astype(np.float32)


def torch_forward(reference, x, training):
  reference.train(training)
  with torch.no_grad():
    return reference(torch.from_numpy(x)).numpy()


def values(factory, wrapper):
  return {n: v.numpy() for n, v in factory.variables_by_name(wrapper).items()}


def assert_state_equals_torch(factory, wrapper, reference, names=None):
  state = reference.state_dict()
  got = values(factory, wrapper)
  for n in names or state:
    want = state[n].numpy()
    if want.dtype.kind in "iub":
      np.testing.assert_array_equal(got[n], want, err_msg=n)
    else:
      np.testing.assert_allclose(got[n], want, err_msg=n, **FLOAT_TOL)


def loss_fn(y, target):
  return tf.reduce_mean((y - target) ** 2)


# ------------------------------------------------------------------ variables


@pytest.mark.parametrize("factory", wrappers("variables"))
def test_variables_mirror_the_torch_state(factory):
  wrapper, reference = wrapped(factory)
  by_name = factory.variables_by_name(wrapper)
  assert sorted(by_name) == sorted(PARAMS + BUFFERS)
  assert {n for n, v in by_name.items() if v.trainable} == set(PARAMS)
  assert sorted(id(v) for v in wrapper.trainable_variables) == sorted(
    id(by_name[n]) for n in PARAMS
  )
  assert by_name["calls"].dtype == tf.int64
  assert by_name["bn.num_batches_tracked"].dtype == tf.int64
  assert_state_equals_torch(factory, wrapper, reference)
  # The torch module the wrapper lends holds the same values.
  lent = wrapper.torch_module.state_dict()
  for n, v in values(factory, wrapper).items():
    np.testing.assert_array_equal(lent[n].numpy(), v, err_msg=n)


# -------------------------------------------------- outputs and buffers


@pytest.mark.parametrize("factory", wrappers("outputs"))
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_outputs_equal_pure_torch(factory, training, in_mode):
  wrapper, reference = wrapped(factory)
  call = in_mode(lambda x: wrapper(x, training=training))
  for seed in range(2):  # the second call runs the traced graph again
    x = data(5, seed)
    got = call(tf.constant(x)).numpy()
    want = torch_forward(reference, x, training)
    assert got.shape == (5, OUT)
    np.testing.assert_allclose(got, want, **FLOAT_TOL)


@pytest.mark.parametrize("factory", wrappers("buffers"))
def test_buffers_update_in_training_mode_as_in_torch(factory, in_mode):
  wrapper, reference = wrapped(factory)
  initial = values(factory, wrapper)
  train = in_mode(lambda x: wrapper(x, training=True))
  evaluate = in_mode(lambda x: wrapper(x, training=False))
  for seed in range(3):
    x = data(6, seed)
    train(tf.constant(x))
    torch_forward(reference, x, training=True)
    assert_state_equals_torch(factory, wrapper, reference)
  after_training = values(factory, wrapper)
  for n in BUFFERS:
    assert not np.array_equal(after_training[n], initial[n]), n
  assert after_training["calls"] == initial["calls"] + 3
  assert after_training["bn.num_batches_tracked"] == (initial["bn.num_batches_tracked"] + 3)
  for n in PARAMS:  # a forward writes no parameter
    np.testing.assert_array_equal(after_training[n], initial[n], err_msg=n)
  # Eval mode reads the running statistics and writes nothing.
  for seed in range(3, 5):
    x = data(6, seed)
    np.testing.assert_allclose(
      evaluate(tf.constant(x)).numpy(), torch_forward(reference, x, training=False), **FLOAT_TOL
    )
  after_eval = values(factory, wrapper)
  for n in after_training:
    np.testing.assert_array_equal(after_eval[n], after_training[n], err_msg=n)


# ------------------------------------------------- gradients and training


def torch_gradients(reference, x, target):
  reference.train(True)
  x_t = torch.from_numpy(x).requires_grad_(True)
  loss = ((reference(x_t) - torch.from_numpy(target)) ** 2).mean()
  names = [n for n, _ in reference.named_parameters()]
  grads = torch.autograd.grad(loss, [p for _, p in reference.named_parameters()] + [x_t])
  return loss.item(), dict(zip(names, grads[:-1])), grads[-1]


@pytest.mark.parametrize("factory", wrappers("gradients"))
def test_gradients_equal_torch_autograd(factory, in_mode):
  wrapper, reference = wrapped(factory)
  by_name = factory.variables_by_name(wrapper)
  variables = [by_name[n] for n in PARAMS]
  x, target = data(6, 0), data(6, 1)[:, :OUT]

  def step(x, target):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = loss_fn(wrapper(x, training=True), target)
    grads = tape.gradient(loss, variables + [x])
    return loss, grads[:-1], grads[-1]

  loss, grads, grad_x = in_mode(step)(tf.constant(x), tf.constant(target))
  want_loss, want_grads, want_grad_x = torch_gradients(reference, x, target)
  np.testing.assert_allclose(loss.numpy(), want_loss, **FLOAT_TOL)
  for n, g in zip(PARAMS, grads):
    assert g is not None, n
    if n in MOVING_PARAMS:  # a non-trivial check
      assert np.abs(want_grads[n].numpy()).max() > 1e-3, n
    np.testing.assert_allclose(
      tf.convert_to_tensor(g).numpy(), want_grads[n].numpy(), err_msg=n, **FLOAT_TOL
    )
  np.testing.assert_allclose(grad_x.numpy(), want_grad_x.numpy(), **FLOAT_TOL)


@pytest.mark.parametrize("factory", wrappers("optimizer_step"))
def test_sgd_steps_equal_torch_sgd(factory, in_mode):
  wrapper, reference = wrapped(factory)
  by_name = factory.variables_by_name(wrapper)
  variables = [by_name[n] for n in PARAMS]
  optimizer = keras.optimizers.SGD(LR)
  torch_optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
  initial = values(factory, wrapper)

  def step(x, target):
    with tf.GradientTape() as tape:
      loss = loss_fn(wrapper(x, training=True), target)
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  step = in_mode(step)
  for seed in range(3):
    x, target = data(6, seed), data(6, seed + 10)[:, :OUT]
    loss = step(tf.constant(x), tf.constant(target))
    reference.train(True)
    torch_optimizer.zero_grad()
    want = ((reference(torch.from_numpy(x)) - torch.from_numpy(target)) ** 2).mean()
    want.backward()
    torch_optimizer.step()
    np.testing.assert_allclose(loss.numpy(), want.item(), **FLOAT_TOL)
    # Parameters (trained) and buffers (written by the forward) alike.
    assert_state_equals_torch(factory, wrapper, reference)
  trained = values(factory, wrapper)
  for n in MOVING_PARAMS:
    assert not np.array_equal(trained[n], initial[n]), n
  # The torch module the wrapper lends holds the trained values too.
  lent = wrapper.torch_module.state_dict()
  for n in PARAMS:
    np.testing.assert_array_equal(lent[n].numpy(), trained[n], err_msg=n)


# --------------------------------------------------------------- retracing


@pytest.mark.parametrize("factory", wrappers("retracing"))
def test_tf_function_retraces_only_for_new_shapes(factory):
  wrapper, reference = wrapped(factory)
  traces = []

  @tf.function
  def forward(x):
    traces.append(x.shape)  # runs only while tracing
    return wrapper(x, training=False)

  for seed in range(2):
    x = data(5, seed)
    np.testing.assert_allclose(
      forward(tf.constant(x)).numpy(), torch_forward(reference, x, training=False), **FLOAT_TOL
    )
  assert len(traces) == 1
  assert forward.experimental_get_tracing_count() == 1
  # A weight update is seen by the traced graph, with no retrace.
  by_name = factory.variables_by_name(wrapper)
  by_name["l2.bias"].assign(by_name["l2.bias"] + 1.0)
  with torch.no_grad():
    reference.l2.bias += 1.0
  x = data(5, 2)
  np.testing.assert_allclose(
    forward(tf.constant(x)).numpy(), torch_forward(reference, x, training=False), **FLOAT_TOL
  )
  assert forward.experimental_get_tracing_count() == 1
  # A new batch size retraces at most once more, and only once.
  for seed in range(3, 5):
    x = data(7, seed)
    np.testing.assert_allclose(
      forward(tf.constant(x)).numpy(), torch_forward(reference, x, training=False), **FLOAT_TOL
    )
  assert len(traces) <= 2
  assert forward.experimental_get_tracing_count() == len(traces)
  forward(tf.constant(data(5, 0)))  # the first shape again: no retrace
  assert forward.experimental_get_tracing_count() == len(traces)


# ------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("factory", wrappers("checkpoint"))
def test_checkpoint_round_trip(factory, tmp_path):
  wrapper, _ = wrapped(factory, seed=0)
  wrapper(tf.constant(data(6, 0)), training=True)  # buffers move
  saved = values(factory, wrapper)
  path = tf.train.Checkpoint(model=wrapper).write(str(tmp_path / "ckpt"))
  stored = [n for n, _ in tf.train.list_variables(path) if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
  assert len(stored) == len(saved), stored

  fresh, _ = wrapped(factory, seed=1)
  x = tf.constant(data(5, 3))
  before = values(factory, fresh)
  for n in saved:  # differently initialised: every value differs
    assert not np.array_equal(before[n], saved[n]), n
  assert not np.array_equal(fresh(x, training=False).numpy(), wrapper(x, training=False).numpy())

  tf.train.Checkpoint(model=fresh).read(path).assert_consumed()
  restored = values(factory, fresh)
  for n in saved:
    assert restored[n].dtype == saved[n].dtype, n
    np.testing.assert_array_equal(restored[n], saved[n], err_msg=n)
  np.testing.assert_array_equal(
    fresh(x, training=False).numpy(), wrapper(x, training=False).numpy()
  )
  lent = fresh.torch_module.state_dict()
  for n in saved:
    np.testing.assert_array_equal(lent[n].numpy(), saved[n], err_msg=n)


# -------------------------------------------------------------- SavedModel

# README, "Limitations": "SavedModel export of the bridged ops [is] not
# possible (a SavedModel cannot carry the Python callables)". The contract
# tested: saving a module that holds the wrapper and a tf.function calling
# it writes the variables; in another process (torchbridge imported) the
# loaded function cannot run, and says so with an error (no crash, no
# output): "Op type not registered 'TorchbridgeCall'" (native op) or "Could
# not find callback" (tf.py_function path), or torchbridge's own message
# naming SavedModel once the op is registered.
_LOAD_AND_CALL = textwrap.dedent(
  r"""
    import json, sys
    import torch
    import tensorflow as tf
    import torchbridge  # noqa: F401
    try:
      loaded = tf.saved_model.load(sys.argv[1])
      out = loaded.serve(tf.ones([2, IN]))
      print(json.dumps({"ran": True, "out": out.numpy().tolist()}))
    except Exception as err:  # pylint: disable=broad-except
      print(json.dumps({"ran": False, "type": type(err).__name__,
                        "message": str(err)}))
    """.replace("IN", str(IN))
)

_SAVED_MODEL_ERRORS = (
  "Op type not registered 'TorchbridgeCall'",
  "Could not find callback",
  "SavedModel",
)


def _saved_and_loaded(factory, tmp_path):
  """The wrapper saved in a SavedModel after a training call and a call
  of its serving function, and what a fresh process gets calling that."""
  # Garbage from earlier tests is collected here, eagerly, not inside the
  # graph that tf.saved_model.save builds (see the "release" cases below).
  gc.collect()
  wrapper, reference = wrapped(factory)
  wrapper(tf.constant(data(6, 0)), training=True)
  root = tf.Module()
  root.wrapper = wrapper
  root.serve = tf.function(
    lambda x: wrapper(x, training=False), input_signature=[tf.TensorSpec([None, IN], tf.float32)]
  )
  root.serve(tf.ones([2, IN]))
  path = str(tmp_path / "saved")
  tf.saved_model.save(root, path)

  # Every variable of the wrapper is in the SavedModel, with its value.
  reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
  stored = [
    reader.get_tensor(k)
    for k in reader.get_variable_to_shape_map()
    if k != "_CHECKPOINTABLE_OBJECT_GRAPH"
  ]
  for n, value in values(factory, wrapper).items():
    assert any(
      s.shape == value.shape and s.dtype == value.dtype and np.array_equal(s, value) for s in stored
    ), n

  out = subprocess.run(
    [sys.executable, "-c", _LOAD_AND_CALL, path],
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return wrapper, json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("factory", wrappers("saved_model"))
def test_saved_model_of_the_default_runner_runs_elsewhere(factory, tmp_path):
  if factory.runner != "default":
    pytest.skip("a torch runner's graph calls need torch (tested below)")
  wrapper, result = _saved_and_loaded(factory, tmp_path)
  assert result["ran"], result
  want = wrapper(tf.ones([2, IN]), training=False).numpy()
  np.testing.assert_allclose(np.array(result["out"]), want, rtol=1e-6)


@pytest.mark.usefixtures("bridge_runner")
@pytest.mark.parametrize("factory", wrappers("saved_model"))
def test_saved_model_of_the_torch_runner_keeps_the_variables_but_cannot_run_elsewhere(
  factory, tmp_path
):
  _, result = _saved_and_loaded(factory, tmp_path)
  assert not result["ran"], result
  assert any(e in result["message"] for e in _SAVED_MODEL_ERRORS), result


# ------------------------------------------------------------ copy, pickle

# The README documents no policy for copying a wrapper itself (only for its
# torch module). The policy tested is that of a plain tf.Module and a Keras
# layer: a deep copy (or a pickle round trip) is an independent wrapper with
# the same values, whose training leaves the original alone.


def assert_independent_copy(factory, original, duplicate, reference):
  assert duplicate is not original
  assert duplicate.torch_module is not original.torch_module
  want = values(factory, original)
  got = values(factory, duplicate)
  assert sorted(got) == sorted(want)
  for n in want:
    np.testing.assert_array_equal(got[n], want[n], err_msg=n)
  x = data(5, 4)
  np.testing.assert_allclose(
    duplicate(tf.constant(x), training=False).numpy(),
    torch_forward(reference, x, training=False),
    **FLOAT_TOL,
  )
  # Training the copy (parameters and buffers) leaves the original alone.
  by_name = factory.variables_by_name(duplicate)
  by_name["l1.weight"].assign(by_name["l1.weight"] * 2.0)
  duplicate(tf.constant(x), training=True)
  after = values(factory, original)
  for n in want:
    np.testing.assert_array_equal(after[n], want[n], err_msg=n)
  np.testing.assert_allclose(
    original(tf.constant(x), training=False).numpy(),
    torch_forward(reference, x, training=False),
    **FLOAT_TOL,
  )


@pytest.mark.parametrize("factory", wrappers("deepcopy"))
def test_deepcopy_is_an_independent_wrapper(factory):
  wrapper, reference = wrapped(factory)
  x = data(6, 0)
  wrapper(tf.constant(x), training=True)
  torch_forward(reference, x, training=True)
  assert_independent_copy(factory, wrapper, copy.deepcopy(wrapper), reference)


@pytest.mark.parametrize("factory", wrappers("pickle"))
def test_pickle_round_trip_is_an_independent_wrapper(factory):
  wrapper, reference = wrapped(factory)
  x = data(6, 0)
  wrapper(tf.constant(x), training=True)
  torch_forward(reference, x, training=True)
  assert_independent_copy(factory, wrapper, pickle.loads(pickle.dumps(wrapper)), reference)


# ----------------------------------------------------- release of the module

# README, `tb.TorchModule`: "When the wrapper is garbage collected, the torch
# module gets copies of the last values back" (between bridged calls its
# tensors are placeholders). Garbage collection runs wherever Python happens
# to allocate, including while a TF graph is the default (tf.saved_model.save
# builds one, as do tf.compat.v1 programs), so both places are tested.


def check_torch_module_outlives_its_wrapper(factory, collect):
  net = make_net(0)
  wrapper = factory.wrap(net, "net")
  by_name = factory.variables_by_name(wrapper)
  by_name["l1.weight"].assign(by_name["l1.weight"] * 2.0)
  x = data(6, 0)
  wrapper(tf.constant(x), training=True)  # buffers move; placeholders in net
  want = values(factory, wrapper)
  assert torch.isnan(net.l1.weight).all()  # the documented placeholder
  del wrapper, by_name
  ignored = []  # exceptions raised by finalizers, which Python only prints
  hook = sys.unraisablehook
  sys.unraisablehook = lambda u: ignored.append(f"{type(u.exc_value).__name__}: {u.exc_value}")
  try:
    collect()
  finally:
    sys.unraisablehook = hook
  assert not ignored, ignored
  state = net.state_dict()
  assert sorted(state) == sorted(want)
  for n, t in state.items():
    np.testing.assert_array_equal(t.numpy(), want[n], err_msg=n)
  assert type(net.l1.weight) is nn.Parameter  # a plain torch module again
  with torch.no_grad():  # and it runs in torch, on its own storage
    assert torch.isfinite(net.eval()(torch.from_numpy(x))).all()


@pytest.mark.parametrize("factory", wrappers("release"))
def test_torch_module_outlives_its_wrapper(factory):
  check_torch_module_outlives_its_wrapper(factory, gc.collect)


@pytest.mark.parametrize("factory", wrappers("release_in_graph"))
def test_torch_module_outlives_its_wrapper_collected_in_a_graph(factory):

  def collect_in_a_graph():
    with tf.Graph().as_default():
      gc.collect()

  check_torch_module_outlives_its_wrapper(factory, collect_in_a_graph)


# ------------------------------------------------------------------ runners


@pytest.mark.parametrize("factory", wrappers("runner"))
@pytest.mark.parametrize("training", [False, True])
def test_graph_calls_take_the_runner_the_factory_names(factory, training):
  # So that every case above ran where its factory says: the TF runner
  # (default), the C++ torch runner, or the torch runner's Python path.
  from torchbridge._runners import _record as _runners  # pylint: disable=import-outside-toplevel

  wrapper, _ = wrapped(factory)
  tf.function(lambda x: wrapper(x, training=training))(tf.constant(data(4)))
  choice = _runners.choices()[wrapper.name]
  from torchbridge._native import _loader  # pylint: disable=import-outside-toplevel

  if factory.runner == "default":
    assert choice["runner"] == "tf", choice
  elif factory.runner == "C++" and not _loader.has_torch_interop():
    # The tf.py_function pass (make test's second): the C++ runner needs the
    # native op, so these calls take the Python path, and say so.
    assert choice["runner"] == "torch" and choice["path"] == "Python", choice
    assert "native op" in choice["path_reason"], choice
  else:
    assert choice["runner"] == "torch" and choice["path"] == factory.runner, choice
