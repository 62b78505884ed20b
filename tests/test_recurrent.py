"""Recurrent torch models across the bridge (issue 19's contract, first part).

An `nn.LSTM` over `pack_padded_sequence(x, seq_lens, enforce_sorted=False)`,
state `(h0, c0)` in and out, outputs padded back to `total_length`: eagerly
and inside `tf.function`, against pure torch. `seq_lens` crosses as a TF
int64 tensor and reaches torch as the int64 CPU tensor packing requires;
gradients through the packed sequence equal pure torch's and are exactly
zero at padded steps; the final state is each sequence's own last step.
"""

import copy

import numpy as np
import pytest
import torch  # before tensorflow
import tensorflow as tf

import torchbridge as tb

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge

B, T, D, H = 4, 6, 3, 5


class PackedLSTM(torch.nn.Module):
  def __init__(self, record=None):
    super().__init__()
    self.lstm = torch.nn.LSTM(D, H, batch_first=True)
    self.record = record

  def forward(self, x, seq_lens, state):
    if self.record is not None and not seq_lens.is_meta:
      self.record.append((seq_lens.dtype, seq_lens.device))
    packed = torch.nn.utils.rnn.pack_padded_sequence(
      x, seq_lens, batch_first=True, enforce_sorted=False
    )
    out, (h, c) = self.lstm(packed, state)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, (h, c)


def _data(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((B, T, D)).astype(np.float32)
  seq_lens = np.array([6, 2, 4, 1], np.int64)
  h0 = rng.standard_normal((1, B, H)).astype(np.float32)
  c0 = rng.standard_normal((1, B, H)).astype(np.float32)
  return x, seq_lens, h0, c0


def _pair(record=None):
  torch.manual_seed(0)
  module = PackedLSTM(record)
  reference = copy.deepcopy(module)
  reference.record = None
  return module, reference


@pytest.fixture(params=["eager", "tf.function"])
def mode(request):
  return request.param


def _maybe_function(fn, mode):
  return tf.function(fn) if mode == "tf.function" else fn


def test_forward_state_and_lengths_match_pure_torch(mode):
  record = []
  module, reference = _pair(record)
  bridged = tb.TorchModule(module, name="lstm")
  x, seq_lens, h0, c0 = _data()
  call = _maybe_function(lambda x, n, h, c: bridged(x, n, (h, c)), mode)
  out, (h, c) = call(tf.constant(x), tf.constant(seq_lens), tf.constant(h0), tf.constant(c0))
  want_out, (want_h, want_c) = reference(
    torch.from_numpy(x), torch.from_numpy(seq_lens), (torch.from_numpy(h0), torch.from_numpy(c0))
  )
  for got, want in ((out, want_out), (h, want_h), (c, want_c)):
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
  assert out.shape == (B, T, H)  # padded back to total_length
  # Outputs at padded steps are zero, so they line up with TF-side masks.
  mask = np.arange(T)[None, :] < seq_lens[:, None]
  assert not np.any(out.numpy()[~mask])
  # The final state is each sequence's own last step (seq_lens - 1).
  np.testing.assert_allclose(h.numpy()[0], out.numpy()[np.arange(B), seq_lens - 1], rtol=1e-6)
  # seq_lens reached torch as the int64 CPU tensor packing requires.
  assert record and all(r == (torch.int64, torch.device("cpu")) for r in record)


def test_gradients_through_packed_sequences(mode):
  module, reference = _pair()
  bridged = tb.TorchModule(module, name="lstm")
  x, seq_lens, h0, c0 = _data()
  weights = np.random.default_rng(1).standard_normal((B, T, H)).astype(np.float32)

  def step(x, n, h, c):
    with tf.GradientTape() as tape:
      tape.watch([x, h, c])
      out, (h_n, _) = bridged(x, n, (h, c))
      loss = tf.reduce_sum(out * weights) + tf.reduce_sum(h_n)
    return tape.gradient(loss, [x, h, c] + list(bridged.trainable_variables))

  grads = _maybe_function(step, mode)(
    tf.constant(x), tf.constant(seq_lens), tf.constant(h0), tf.constant(c0)
  )
  x_t = torch.from_numpy(x).requires_grad_()
  h_t = torch.from_numpy(h0).requires_grad_()
  c_t = torch.from_numpy(c0).requires_grad_()
  out_t, (hn_t, _) = reference(x_t, torch.from_numpy(seq_lens), (h_t, c_t))
  loss_t = (out_t * torch.from_numpy(weights)).sum() + hn_t.sum()
  params = dict(reference.named_parameters())
  names = [v.name[len("lstm/") : -2] for v in bridged.trainable_variables]
  want = torch.autograd.grad(loss_t, [x_t, h_t, c_t] + [params[n] for n in names])
  for got, w in zip(grads, want):
    np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), w.numpy(), rtol=1e-4, atol=1e-6)
  # Exactly zero at padded steps: they never entered the LSTM.
  mask = np.arange(T)[None, :] < seq_lens[:, None]
  assert not np.any(grads[0].numpy()[~mask])


def test_zero_length_sequence_is_refused_with_torchs_message(mode):
  module, _ = _pair()
  bridged = tb.TorchModule(module, name="lstm")
  x, _, h0, c0 = _data()
  call = _maybe_function(lambda x, n, h, c: bridged(x, n, (h, c)), mode)
  # Eagerly torch's RuntimeError; from a graph a TF error (UnknownError, as
  # tf.py_function maps RuntimeError) holding its message and traceback.
  with pytest.raises((RuntimeError, tf.errors.OpError)) as info:
    call(tf.constant(x), tf.constant([3, 0, 2, 1], tf.int64), tf.constant(h0), tf.constant(c0))
  assert "greater than 0" in str(info.value)  # torch's own words
  # The module still works afterwards.
  out, _ = call(
    tf.constant(x), tf.constant([3, 1, 2, 1], tf.int64), tf.constant(h0), tf.constant(c0)
  )
  assert out.shape == (B, T, H)


def test_int32_lengths_reach_torch_as_int32_cpu_and_pack_the_same(mode):
  # int32 is the lengths dtype to use when the model runs on a GPU: TF keeps
  # int32 tensors in host memory there, so they reach torch on the CPU, where
  # packing wants them (it converts them to int64 itself; README, "Recurrent
  # policies"). On this CPU machine: same dtype and device path, same result.
  record = []
  module, reference = _pair(record)
  bridged = tb.TorchModule(module, name="lstm")
  x, seq_lens, h0, c0 = _data()
  call = _maybe_function(lambda x, n, h, c: bridged(x, n, (h, c)), mode)
  out, (h, c) = call(
    tf.constant(x), tf.constant(seq_lens, tf.int32), tf.constant(h0), tf.constant(c0)
  )
  want_out, (want_h, _) = reference(
    torch.from_numpy(x), torch.from_numpy(seq_lens), (torch.from_numpy(h0), torch.from_numpy(c0))
  )
  np.testing.assert_allclose(out.numpy(), want_out.detach().numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(h.numpy(), want_h.detach().numpy(), rtol=1e-5, atol=1e-6)
  assert record and set(record) == {(torch.int32, torch.device("cpu"))}
