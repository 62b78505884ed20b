"""The one check of a capture against torch (`_capture/_parity.py`), the
one tolerance table it and `tb.translate` read (`_translate/_tolerance.py`),
and the one `torch.export` per signature both runners lower
(`_capture/_shared_export.py`)."""

import gc

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from torchbridge._capture import _parity
from torchbridge._capture import _shared_export
from torchbridge._native import _loader
from torchbridge._translate import _export
from torchbridge._translate import _refusal
from torchbridge._translate import _tolerance

# Runs the runners' captures in process (the C++ one with the native op).
pytestmark = pytest.mark.one_pass


class _Net(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.linear = torch.nn.Linear(3, 4)
    self.norm = torch.nn.BatchNorm1d(4)

  def forward(self, x):
    return torch.tanh(self.norm(self.linear(x))), x.sum()


def _state_and_export(net, specs):
  module = tb.TorchModule(net, name="checked")
  state = module._state  # pylint: disable=protected-access
  call = type("Call", (), {})()
  call.args_tf = list(specs)  # their shape and dtype are what an export reads
  call.substitute = lambda flat: (flat, {})
  shared = _shared_export.SharedExport(state, call)
  with state.held(net.training):
    program = shared.lowered(decompose=False)
  return module, state, shared, program


def _torch_side_as_candidate(state, shared, program, perturb=None):
  """A candidate that runs torch itself (what a perfect capture returns),
  with `perturb(kind, k, value)` applied to what it hands back."""
  perturb = perturb or (lambda kind, k, value: value)

  def candidate(trial):
    names = state.param_names + state.buffer_names
    leaves = {n: trial.values_torch[n].clone().requires_grad_(n in trial.trainable) for n in names}
    inputs = [x.clone().requires_grad_(x.is_floating_point()) for x in trial.inputs_torch]
    tensors = {f"module.{n}": t for n, t in leaves.items()}
    result = torch.func.functional_call(shared.flat, tensors, tuple(inputs))
    outputs = _parity.flat_outputs(program.structure, list(result))
    writes = {n: leaves[n].detach() for n in _parity.program_writes(program, state.state_names)}
    grads = torch.autograd.grad(
      [outputs[k] for k in trial.differentiated],
      [leaves[n] for n in trial.trainable] + [x for x in inputs if x.requires_grad],
      [torch.from_numpy(c) for c in trial.cotangents],
      allow_unused=True,
    )
    return _parity.Results(
      [perturb("output", k, o.detach().numpy()) for k, o in enumerate(outputs)],
      {n: perturb("write", n, w.numpy()) for n, w in writes.items()},
      [None if g is None else perturb("grad", k, g.numpy()) for k, g in enumerate(grads)],
    )

  return candidate


def test_the_check_passes_torch_itself_and_refuses_each_kind_of_difference():
  torch.manual_seed(0)
  net = _Net().train()
  specs = [tf.TensorSpec([None, 3], tf.float32)]
  _, state, shared, program = _state_and_export(net, specs)
  _parity.check(
    state, shared.flat, specs, program, _torch_side_as_candidate(state, shared, program)
  )
  for kind, what in [("output", "output 0"), ("write", "buffer"), ("grad", "gradient of")]:

    def perturb(k_kind, k, value, kind=kind):
      return value + 1e-2 if k_kind == kind and k in (0, "norm.running_mean") else value

    with pytest.raises(_refusal.Refusal, match=what) as refused:
      _parity.check(
        state,
        shared.flat,
        specs,
        program,
        _torch_side_as_candidate(state, shared, program, perturb),
      )
    assert refused.value.what == "check" and "differs from torch's" in refused.value.reason


def test_the_check_puts_the_users_random_state_back():
  torch.manual_seed(5)
  net = _Net().eval()
  specs = [tf.TensorSpec([2, 3], tf.float32)]
  _, state, shared, program = _state_and_export(net, specs)
  before = torch.random.get_rng_state()
  _parity.check(
    state, shared.flat, specs, program, _torch_side_as_candidate(state, shared, program)
  )
  assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize(
  "dtype, off, ok",
  [
    (tf.float32, 5e-7, True),
    (tf.float32, 5e-5, False),
    (tf.float64, 5e-11, True),
    (tf.float64, 5e-9, False),
    (tf.float16, 5e-4, True),
  ],
)
def test_one_table_holds_each_dtype_to_its_precision(dtype, off, ok):
  want = np.array([0.5, -0.25], dtype.as_numpy_dtype)
  found = _tolerance.difference(want + np.array(off, want.dtype), want, dtype)
  assert found.ok == ok


def test_an_absolute_tolerance_scales_with_large_values_in_a_check_not_in_translate():
  want = np.float32([1000.0])
  got = want + np.float32(1e-3)
  assert _tolerance.difference(got, want, tf.float32).ok  # 1e-6 * 1000 + 1e-5 * 1000
  tight = _tolerance.Tolerance(0.0, 1e-6)
  assert not _tolerance.difference(got, want, tf.float32, given=tight, scaled=False).ok


def test_integers_must_be_equal():
  assert _tolerance.difference(np.int64([1, 2]), np.int64([1, 2]), tf.int64).ok
  assert not _tolerance.difference(np.int64([1, 3]), np.int64([1, 2]), tf.int64).ok


def test_a_tensor_that_is_not_state_is_one_refusal():
  class Reads(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.linear = torch.nn.Linear(2, 2)

  program = _export.Program(None, [], {"p": "stray"}, {}, 0, ())
  with pytest.raises(_refusal.Refusal, match="'stray', which is not a parameter or buffer"):
    _export.state_reads(program, {"linear.weight": "linear.weight"})


class _Spectrum(torch.nn.Module):
  """An op without a TF translation: the TF runner refuses after the export."""

  def __init__(self):
    super().__init__()
    self.scale = torch.nn.Parameter(torch.ones(4))

  def forward(self, x):
    return torch.fft.fft(x * self.scale).real


@pytest.mark.skipif(not _loader.has_torch_interop(), reason="the C++ runner needs the native op")
def test_a_translation_refused_after_the_export_is_not_exported_again_for_the_cpp_runner():
  gc.collect()
  module = tb.TorchModule(_Spectrum(), name="spectrum_once")
  before = _shared_export.SharedExport.exports
  y = tf.function(lambda x: module(x))(tf.ones([2, 4]))
  assert _shared_export.SharedExport.exports - before == 1
  np.testing.assert_allclose(y.numpy(), np.full([2, 4], [4.0, 0, 0, 0]), atol=1e-5)
  from torchbridge._runners import _record  # pylint: disable=import-outside-toplevel

  choice = _record.choices()["spectrum_once"]
  assert choice["runner"] == "torch" and choice["path"] == "C++", choice


def test_the_shared_export_is_dropped_when_the_dispatch_ends():
  """It holds the module's tensors (views of the variables): kept, TF would
  copy each variable on its next update."""
  gc.collect()
  module = tb.TorchModule(torch.nn.Linear(3, 2), name="dropped")
  made = []
  real = _shared_export.SharedExport.__init__

  def remember(self, *args):
    real(self, *args)
    made.append(self)

  try:
    _shared_export.SharedExport.__init__ = remember
    tf.function(lambda x: module(x))(tf.ones([2, 3]))
  finally:
    _shared_export.SharedExport.__init__ = real
  assert made and all(s._program_torch is None for s in made)  # pylint: disable=protected-access


class _PositionIds(torch.nn.Module):
  """A non-persistent buffer the forward reads (Hugging Face's position ids):
  in no state_dict, yet state the capture must read from its variable."""

  def __init__(self):
    super().__init__()
    self.embed = torch.nn.Embedding(6, 3)
    self.register_buffer("position_ids", torch.arange(6)[None], persistent=False)

  def forward(self, x):
    return x + self.embed(self.position_ids[:, : x.shape[1]])


@pytest.mark.parametrize("run, runner, path", [("auto", "tf", None), ("torch", "torch", "C++")])
def test_a_non_persistent_buffer_is_read_by_every_runner(run, runner, path):
  if path == "C++" and not _loader.has_torch_interop():
    pytest.skip("the C++ runner needs the native op")
  gc.collect()
  torch.manual_seed(0)
  net = _PositionIds()
  module = tb.TorchModule(net, name=f"positions_{run}", run=run)
  x = tf.random.normal([2, 4, 3])
  y = tf.function(lambda x: module(x))(x)
  np.testing.assert_allclose(y.numpy(), net(torch.from_numpy(x.numpy())).detach().numpy(), 1e-6)
  from torchbridge._runners import _record  # pylint: disable=import-outside-toplevel

  choice = _record.choices()[f"positions_{run}"]
  assert choice["runner"] == runner and choice.get("path") == path, choice


class _Batchwise(torch.nn.Module):
  """Per-example math: torch.export keeps its batch symbolic."""

  def __init__(self):
    super().__init__()
    self.linear = torch.nn.Linear(5, 4)

  def forward(self, x, mask):
    return torch.tanh(self.linear(x)).reshape(x.shape[0], -1) * mask


class _Specializes(_Batchwise):
  """Branches on the batch size: torch.export specializes it."""

  def forward(self, x, mask):
    scale = 2.0 if x.shape[0] == 8 else 1.0
    return super().forward(x, mask) * scale


def _checked_batches(monkeypatch):
  """The batch sizes the checks ran at (the first input's leading size)."""
  monkeypatch.setattr(_shared_export, "SMALL_BATCH_PARAMETERS", 1)  # every module is "large"
  batches = []
  real = _parity.check

  def spy(state, flat, specs, program, candidate, **kwargs):
    def seen(trial):
      batches.append(trial.inputs_torch[0].shape[0])
      return candidate(trial)

    return real(state, flat, specs, program, seen, **kwargs)

  monkeypatch.setattr(_parity, "check", spy)
  return batches


@pytest.mark.parametrize(
  "net_type, checked_at", [(_Batchwise, _shared_export.SMALL_BATCH), (_Specializes, 8)]
)
@pytest.mark.parametrize("run, runner", [("auto", "tf"), ("torch", "torch")])
def test_a_large_module_is_checked_at_a_small_batch_where_export_keeps_the_batch(
  monkeypatch, net_type, checked_at, run, runner
):
  if runner == "torch" and not _loader.has_torch_interop():
    pytest.skip("the C++ runner needs the native op")
  batches = _checked_batches(monkeypatch)
  gc.collect()
  torch.manual_seed(0)
  net = net_type()
  name = f"{net_type.__name__.lower().strip('_')}_{run}"
  module = tb.TorchModule(net, name=name, run=run)
  x, mask = tf.random.normal([8, 2, 5]), tf.cast(tf.random.uniform([8, 1]) > 0.5, tf.float32)
  shapes = []

  @tf.function
  def call(x, mask):
    y = module(x, mask)
    shapes.append(y.shape.as_list())  # static at the call's batch, as traced
    return y

  y = call(x, mask)
  want = net(torch.from_numpy(x.numpy()), torch.from_numpy(mask.numpy())).detach().numpy()
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-6)
  assert shapes == [[8, 8]]
  assert batches == [checked_at]
  from torchbridge._runners import _record  # pylint: disable=import-outside-toplevel

  assert _record.choices()[name]["runner"] == runner


def test_a_small_module_is_checked_at_the_calls_batch(monkeypatch):
  batches = _checked_batches(monkeypatch)
  monkeypatch.setattr(_shared_export, "SMALL_BATCH_PARAMETERS", 10**6)
  gc.collect()
  module = tb.TorchModule(_Batchwise(), name="small_batchwise")
  tf.function(lambda x, m: module(x, m))(tf.ones([8, 2, 5]), tf.ones([8, 1]))
  assert batches == [8]


class _AttentionDropout(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.project = torch.nn.Linear(4, 12)

  def forward(self, x):
    q, k, v = self.project(x).chunk(3, dim=-1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.25)


@pytest.mark.skipif(not _loader.has_torch_interop(), reason="the C++ runner needs the native op")
def test_an_op_kept_whole_that_refuses_is_refused_before_decomposing(monkeypatch):
  """Attention with dropout has no translation: the TF runner refuses it
  on torch.export's graph, without decomposing it (BERT: 4.6 s)."""
  lowered = []
  real = _export.lowered_export
  monkeypatch.setattr(_export, "lowered_export", lambda *a: lowered.append(a[3]) or real(*a))
  gc.collect()
  module = tb.TorchModule(_AttentionDropout().train(), name="attention_dropout")
  y = tf.function(lambda x: module(x, training=True))(tf.ones([2, 3, 4]))
  assert y.shape == [2, 3, 4]
  assert lowered == [False]  # the C++ runner's lowering only
  from torchbridge._runners import _record  # pylint: disable=import-outside-toplevel

  choice = _record.choices()["attention_dropout"]
  assert choice["runner"] == "torch" and "attention dropout" in choice["reason"], choice


def test_a_guard_torch_export_took_on_a_dynamic_size_is_never_dropped():
  """torch.export checks `x.shape[0] != 8` only in `program.module()`; a
  capture runs the graph, so a capture for every batch would take the
  wrong branch at 8. It is refused: the calls run torch, right at 8."""
  gc.collect()
  torch.manual_seed(0)
  net = _Specializes()
  module = tb.TorchModule(net, name="guarded")
  call = tf.function(
    lambda x, m: module(x, m),
    input_signature=[tf.TensorSpec([None, 2, 5]), tf.TensorSpec([None, 1])],
  )
  for batch in (3, 8):
    x, mask = tf.random.normal([batch, 2, 5]), tf.ones([batch, 1])
    want = net(torch.from_numpy(x.numpy()), torch.from_numpy(mask.numpy())).detach().numpy()
    np.testing.assert_allclose(call(x, mask).numpy(), want, rtol=1e-6, atol=1e-6)
  from torchbridge._runners import _record  # pylint: disable=import-outside-toplevel

  choice = _record.choices()["guarded"]
  assert "holds only where Ne(" in choice["reason"], choice
