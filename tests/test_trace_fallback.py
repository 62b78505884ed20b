"""Issue 18: output specs beyond meta tensors, declared signatures with
buffer write-back, and gradients only where one can be asked for."""

import numpy as np
import pytest
import torch  # before tensorflow
import tensorflow as tf

import torchbridge as tb

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge


class ValueReading(torch.nn.Module):
  """Reads a value in its forward (`.item()`), as HF masking code does, and
  keeps a BatchNorm whose running statistics it writes."""

  def __init__(self):
    super().__init__()
    self.norm = torch.nn.BatchNorm1d(4)
    self.linear = torch.nn.Linear(4, 3)

  def forward(self, x, mask):
    if mask.sum().item() == mask.numel():  # nothing masked: a fast path
      return self.linear(self.norm(x))
    return self.linear(self.norm(x * mask[:, None]))


def _pair(seed=0):
  torch.manual_seed(seed)
  module = ValueReading()
  import copy  # pylint: disable=import-outside-toplevel

  return module, copy.deepcopy(module)


def _data():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((6, 4)).astype(np.float32)
  mask = np.array([1, 1, 0, 1, 1, 1], np.float32)
  return x, mask


@pytest.mark.parametrize("declared", [False, True], ids=["inferred", "output_signature"])
def test_value_reading_module_trains_in_tf_function(declared):
  module, reference = _pair()
  signature = tf.TensorSpec([None, 3], tf.float32) if declared else None
  bridged = tb.TorchModule(module, name="vr", output_signature=signature)
  x, mask = _data()
  shapes = []

  @tf.function
  def step(x, mask):
    y = bridged(x, mask, training=True)
    shapes.append(y.shape.as_list())
    return y

  got = step(tf.constant(x), tf.constant(mask)).numpy()
  reference.train()
  want = reference(torch.from_numpy(x), torch.from_numpy(mask))
  np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-6)
  assert shapes == [[None, 3] if declared else [6, 3]]
  # The running statistics were written back, as in pure torch.
  state = bridged.torch_module.state_dict()
  for name in ("norm.running_mean", "norm.running_var", "norm.num_batches_tracked"):
    np.testing.assert_allclose(
      state[name].numpy(), reference.state_dict()[name].numpy(), rtol=1e-6, err_msg=name
    )
  assert int(state["norm.num_batches_tracked"]) == 1


def test_tracing_leaves_torch_random_state_alone():
  bridged = tb.torch_function(lambda x: x * int(x.sum().item() > 0))  # needs the real fallback
  torch.manual_seed(7)
  tf.function(lambda x: bridged(x)).get_concrete_function(tf.TensorSpec([None, 2], tf.float32))
  after = torch.rand(3)
  torch.manual_seed(7)
  np.testing.assert_array_equal(after.numpy(), torch.rand(3).numpy())


def test_module_weights_stand_in_as_themselves():
  # The real run sees the module's current weights, not ones.
  seen = []

  class Probe(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.w = torch.nn.Parameter(torch.full((2,), 3.0))

    def forward(self, x):
      seen.append(self.w.detach().clone())
      return x * self.w[int(x.sum().item() > 1e9)]

  bridged = tb.TorchModule(Probe(), name="probe")
  out = tf.function(lambda x: bridged(x))(tf.ones([4]))
  np.testing.assert_array_equal(out.numpy(), [3.0] * 4)
  real = [w for w in seen if not w.is_meta]
  assert real and all(torch.equal(w, torch.full((2,), 3.0)) for w in real)


def test_pack_padded_lstm_traces_and_matches_pure_torch():
  torch.manual_seed(0)
  lstm = torch.nn.LSTM(3, 5, batch_first=True)

  class Packed(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.lstm = lstm

    def forward(self, x, lengths):
      packed = torch.nn.utils.rnn.pack_padded_sequence(
        x, lengths, batch_first=True, enforce_sorted=False
      )
      out, (h, _) = self.lstm(packed)
      out, _ = torch.nn.utils.rnn.pad_packed_sequence(
        out, batch_first=True, total_length=x.shape[1]
      )
      return out, h[0]

  import copy  # pylint: disable=import-outside-toplevel

  module = Packed()
  reference = copy.deepcopy(module)
  bridged = tb.TorchModule(module, name="packed")
  x = np.random.default_rng(0).standard_normal((3, 4, 3)).astype(np.float32)
  lengths = np.array([4, 2, 1], np.int64)
  out, h = tf.function(lambda x, n: bridged(x, n))(tf.constant(x), tf.constant(lengths))
  want_out, want_h = reference(torch.from_numpy(x), torch.from_numpy(lengths))
  np.testing.assert_allclose(out.numpy(), want_out.detach().numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(h.numpy(), want_h.detach().numpy(), rtol=1e-5, atol=1e-6)
  assert out.shape == (3, 4, 5)


# --- requires_grad only where a gradient can be asked for. ---


def _recording_fn(record):

  def fn(x, y):
    record.append((x.requires_grad, y.requires_grad))
    return x * y

  return tb.torch_function(fn)


def test_eagerly_only_watched_inputs_require_grad():
  record = []
  fn = _recording_fn(record)
  x, y = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])
  fn(x, y)  # no tape: no autograd graph at all
  with tf.GradientTape() as tape:
    tape.watch(x)
    out = fn(x, y)
  grad_x, grad_y = tape.gradient(out, [x, y])
  assert record == [(False, False), (True, False)]
  np.testing.assert_array_equal(grad_x.numpy(), [3.0, 4.0])
  assert grad_y is None


def test_in_a_graph_stop_gradient_inputs_do_not_require_grad():
  record = []
  fn = _recording_fn(record)

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = fn(x, tf.stop_gradient(y))
    return tape.gradient(out, x)

  grad = step(tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0]))
  np.testing.assert_array_equal(grad.numpy(), [3.0, 4.0])
  # The trace-time meta run records under no_grad; the real run: only x.
  assert record == [(False, False), (True, False)]


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_input_torch_cannot_differentiate_gets_no_gradient(mode):
  # soft_margin_loss refuses a target that requires grad; watched anyway,
  # the target gets None eagerly and zeros from a graph, and the input its
  # true gradient.
  loss_fn = tb.TorchModule(torch.nn.SoftMarginLoss(), name="loss")
  x = tf.constant([0.5, -1.0, 2.0])
  target = tf.constant([1.0, -1.0, -1.0])

  def step(x, target):
    with tf.GradientTape() as tape:
      tape.watch([x, target])
      loss = loss_fn(x, target)
    return loss, tape.gradient(loss, [x, target])

  if mode == "graph":
    step = tf.function(step)
  for _ in range(2):  # the second call knows which argument torch refuses
    loss, (grad_x, grad_target) = step(x, target)
    x_torch = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    want = torch.nn.functional.soft_margin_loss(x_torch, torch.tensor([1.0, -1.0, -1.0]))
    (want_grad,) = torch.autograd.grad(want, [x_torch])
    np.testing.assert_allclose(loss.numpy(), want.item(), rtol=1e-6)
    np.testing.assert_allclose(grad_x.numpy(), want_grad.numpy(), rtol=1e-6)
    if mode == "eager":
      assert grad_target is None
    else:
      np.testing.assert_array_equal(grad_target.numpy(), [0.0, 0.0, 0.0])


def test_meta_spec_mismatch_names_the_way_out():
  # torch's meta kernel of multilabel_margin_loss(reduction="none") on a 1-d
  # input may disagree with the CPU kernel; whatever the kernel, a declared
  # spec that the real output contradicts gets an error that says how the
  # spec was found and names output_signature.
  fn = tb.torch_function(
    lambda x: x.reshape(-1)[:2], output_signature=tf.TensorSpec([3], tf.float32), name="short"
  )
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    tf.function(lambda x: fn(x))(tf.ones([4]))
  message = " ".join(str(info.value).split())
  assert "short output 0 has shape (2,), but (3,) was declared" in message
  assert "by output_signature" in message and "fix output_signature" in message


def test_bad_output_signature_for_modules_names_the_argument():
  with pytest.raises(
    TypeError,
    match=r"TorchModule\(\) output_signature "
    r"must hold tf.TensorSpec leaves, got None",
  ):
    tb.TorchModule(torch.nn.Linear(2, 3), output_signature=[None, 3])
