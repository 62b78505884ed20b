"""`translate`: a TorchModule as pure TF ops reading the same variables.

Each covered model is translated once (cached) and then checked against
torch: eagerly, in `tf.function` and with XLA; gradients against the
bridge's; a SavedModel in a process where torch cannot be imported; TFLite.
"""

import functools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from torchbridge._translate._aten import _table
from torchbridge import ParityError, UntranslatedOpsError, translate

# The same in both passes of `make test`: run in the native pass only.
pytestmark = pytest.mark.one_pass

F32 = dict(rtol=1e-5, atol=1e-6)
F64 = dict(rtol=1e-10, atol=1e-10)


def _cnn():
  cnn = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
    torch.nn.BatchNorm2d(8),
    torch.nn.ReLU(),
    torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2),
    torch.nn.BatchNorm2d(8),
    torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.AvgPool2d(2, padding=1),
    torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(),
    torch.nn.Linear(8, 2),
  )
  for bn in (cnn[1], cnn[4]):  # running statistics worth reading
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 2)
    bn.bias.data.uniform_(-1, 1)
  return cnn


def _cnn_more():
  """Transposed and 1-d convolutions, InstanceNorm, every pooling option."""
  return torch.nn.Sequential(
    torch.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
    torch.nn.InstanceNorm2d(4, affine=True),
    torch.nn.ELU(),
    torch.nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
    torch.nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    torch.nn.AdaptiveMaxPool2d((3, 2)),
    torch.nn.AdaptiveAvgPool2d((2, 1)),
    torch.nn.Flatten(2),
    torch.nn.Conv1d(4, 6, 2, groups=2),
    torch.nn.Hardswish(),
    torch.nn.Flatten(),
  )


class _Recurrent(torch.nn.Module):
  def __init__(self, kind, **kwargs):
    super().__init__()
    self.rnn = kind(3, 6, num_layers=2, batch_first=True, **kwargs)
    directions = 2 if kwargs.get("bidirectional") else 1
    self.head = torch.nn.Linear(6 * directions, 2)

  def forward(self, x):
    out, state = self.rnn(x)
    h = state[0] if isinstance(state, tuple) else state
    return self.head(out[:, -1]) + h.sum(0).mean(-1, keepdim=True)


class _Tokens(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.emb = torch.nn.Embedding(10, 8)
    self.norm = torch.nn.LayerNorm(8)

  def forward(self, ids):
    return self.norm(self.emb(ids)).mean(1)


class _Attention(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

  def forward(self, x):
    out, weights = self.attn(x, x, x)
    return out, weights


class _TensorOps(torch.nn.Module):
  """The common tensor ops a forward writes by hand."""

  def __init__(self):
    super().__init__()
    self.w = torch.nn.Parameter(torch.randn(4, 6))
    self.register_buffer("scale", torch.rand(6) + 0.5)

  def forward(self, x, y):
    a = (x @ self.w) * self.scale - 0.5 / self.scale + x.sum(-1, keepdim=True)
    b = torch.cat([a, torch.exp(-a.abs()), torch.log1p(a**2)], dim=1)
    c = b.view(-1, 3, 6).permute(0, 2, 1).transpose(1, 2)
    d = torch.bmm(c, c.transpose(1, 2)).unsqueeze(1).squeeze(1)
    e = torch.where(d > 0, d.clamp(max=2.0), torch.sigmoid(d))
    f = e[:, 1:, ::2].reshape(e.shape[0], -1) / (1 + y[:, :1].pow(2))
    g = torch.stack([f.mean(1), f.amax(1), f[:, 0].sqrt().abs()], -1)
    h = c[:, torch.tensor([0, 2, -1])][:, [1, 0], [3, -1]]  # advanced
    h_apart = c[[0, -1], :, [1, 2]]  # index tensors on axes 0 and 2
    q = c.unsqueeze(1).expand(-1, 2, -1, -1) * torch.tensor([[[1.0]], [[0.5]]])
    attended = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).flatten(1)
    return (
      g.softmax(-1),
      torch.maximum(a, x[:, :1]).max(-1).indices,
      a.argmin(1),
      h,
      h_apart,
      attended,
    )


def _mlp():
  return torch.nn.Sequential(
    torch.nn.Linear(3, 16),
    torch.nn.ReLU(),
    torch.nn.Linear(16, 16),
    torch.nn.Tanh(),
    torch.nn.Dropout(0.3),
    torch.nn.Linear(16, 16),
    torch.nn.GELU(),
    torch.nn.Linear(16, 16),
    torch.nn.Sigmoid(),
    torch.nn.Linear(16, 4),
    torch.nn.Softmax(-1),
    torch.nn.LogSoftmax(-1),
  )


# name -> (build, input specs, make inputs(batch) as numpy)
CASES = {
  "mlp": (_mlp, [tf.TensorSpec([None, 3])], lambda n: [np.random.randn(n, 3)]),
  "mlp_f64": (
    lambda: _mlp().double(),
    [tf.TensorSpec([None, 3], tf.float64)],
    lambda n: [np.random.randn(n, 3)],
  ),
  "tensor_ops": (
    _TensorOps,
    [tf.TensorSpec([None, 4]), tf.TensorSpec([None, 2])],
    lambda n: [np.random.randn(n, 4), np.random.randn(n, 2)],
  ),
  "cnn": (_cnn, [tf.TensorSpec([None, 3, 16, 16])], lambda n: [np.random.randn(n, 3, 16, 16)]),
  "cnn_more": (
    _cnn_more,
    [tf.TensorSpec([None, 3, 9, 11])],
    lambda n: [np.random.randn(n, 3, 9, 11)],
  ),
  "lstm": (
    lambda: _Recurrent(torch.nn.LSTM),
    [tf.TensorSpec([None, 5, 3])],
    lambda n: [np.random.randn(n, 5, 3)],
  ),
  "gru": (
    lambda: _Recurrent(torch.nn.GRU),
    [tf.TensorSpec([None, 5, 3])],
    lambda n: [np.random.randn(n, 5, 3)],
  ),
  # The Serving guide's coverage list: RNN (tanh/relu), bidirectional.
  "rnn_tanh": (
    lambda: _Recurrent(torch.nn.RNN),
    [tf.TensorSpec([None, 5, 3])],
    lambda n: [np.random.randn(n, 5, 3)],
  ),
  "rnn_relu_bidirectional": (
    lambda: _Recurrent(torch.nn.RNN, nonlinearity="relu", bidirectional=True),
    [tf.TensorSpec([None, 5, 3])],
    lambda n: [np.random.randn(n, 5, 3)],
  ),
  "lstm_bidirectional": (
    lambda: _Recurrent(torch.nn.LSTM, bidirectional=True),
    [tf.TensorSpec([None, 5, 3])],
    lambda n: [np.random.randn(n, 5, 3)],
  ),
  "tokens": (
    _Tokens,
    [tf.TensorSpec([None, 4], tf.int64)],
    lambda n: [np.random.randint(0, 10, (n, 4))],
  ),
  "attention": (_Attention, [tf.TensorSpec([None, 4, 8])], lambda n: [np.random.randn(n, 4, 8)]),
  "encoder": (
    lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
    [tf.TensorSpec([None, None, 8])],
    lambda n: [np.random.randn(n, 3 + n % 3, 8)],
  ),
}


def _gpt2():
  transformers = pytest.importorskip("transformers")
  config = transformers.GPT2Config(
    n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0
  )

  class Logits(torch.nn.Module):  # the LM head's weight is tied to wte's
    def __init__(self):
      super().__init__()
      self.gpt2 = transformers.GPT2LMHeadModel(config)

    def forward(self, ids):
      return self.gpt2(input_ids=ids, use_cache=False).logits

  return Logits()


CASES["gpt2"] = (
  _gpt2,
  [tf.TensorSpec([None, 6], tf.int64)],
  lambda n: [np.random.randint(0, 50, (n, 6))],
)


@functools.cache
def _translated(name):
  build, specs, make = CASES[name]
  torch.manual_seed(0)
  np.random.seed(0)
  actor = tb.TorchModule(build().eval(), name=name)
  examples = make(2) if name in ("tokens", "gpt2") else None
  served = translate(actor, specs, example_inputs=examples)
  return actor, served


def _inputs(name, batch=5):
  build, specs, make = CASES[name]
  np.random.seed(batch)
  return [a.astype(s.dtype.as_numpy_dtype) for a, s in zip(make(batch), specs)]


def _torch_outputs(actor, inputs):
  with torch.no_grad():
    result = actor.torch_module(*[torch.from_numpy(a) for a in inputs])
  return [t.numpy() for t in (result if isinstance(result, tuple) else (result,))]


def _assert_close(got_tf, want, tol):
  got = tf.nest.flatten(got_tf)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), w, **tol)


@pytest.mark.parametrize("how", ["eager", "function", "jit"])
@pytest.mark.parametrize("name", list(CASES))
def test_outputs_equal_torch(name, how):
  actor, served = _translated(name)
  inputs = _inputs(name)
  call = {
    "eager": lambda *x: served(*x),
    "function": tf.function(lambda *x: served(*x)),
    "jit": tf.function(lambda *x: served(*x), jit_compile=True),
  }[how]
  got = call(*[tf.constant(a) for a in inputs])
  _assert_close(got, _torch_outputs(actor, inputs), F64 if name.endswith("f64") else F32)
  assert all(0 <= d < 1e-5 for d in served.parity)


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "tokens", "encoder", "gpt2"])
def test_reads_the_same_variables(name):
  actor, served = _translated(name)
  assert sorted(map(id, served.variables)) == sorted(map(id, actor.variables))
  inputs = [tf.constant(a) for a in _inputs(name)]
  before = tf.nest.flatten(served(*inputs))
  saved = actor.get_weights()
  try:
    for v in actor.trainable_variables:
      v.assign(v * 0.8)
    after = served(*inputs)
    _assert_close(after, _torch_outputs(actor, _inputs(name)), F32)
    assert not np.allclose(tf.nest.flatten(after)[0], before[0])
  finally:
    actor.set_weights(saved)


@pytest.mark.parametrize(
  "name", ["mlp", "mlp_f64", "cnn", "lstm", "tokens", "tensor_ops", "encoder", "gpt2"]
)
def test_gradients_equal_the_bridge(name):
  actor, served = _translated(name)
  inputs = [tf.constant(a) for a in _inputs(name)]
  variables = actor.trainable_variables

  def loss(fn):
    with tf.GradientTape() as tape:
      value = sum(tf.reduce_sum(tf.sin(y)) for y in tf.nest.flatten(fn()) if y.dtype.is_floating)
    return tape.gradient(value, variables)

  grads_served = loss(lambda: served(*inputs))
  grads_bridge = loss(lambda: actor(*inputs, training=False))
  tol = F64 if name.endswith("f64") else dict(rtol=1e-4, atol=1e-6)
  for v, g, want in zip(variables, grads_served, grads_bridge):
    assert g is not None, v.name
    np.testing.assert_allclose(tf.convert_to_tensor(g), want, err_msg=v.name, **tol)


_LOAD_WITHOUT_TORCH = """\
import sys
sys.modules["torch"] = None  # any import of torch now fails
import numpy as np
import tensorflow as tf
try:
  import torch
  raise SystemExit("torch could be imported")
except ImportError:
  pass
for name in sys.argv[2:]:
  data = np.load(f"{sys.argv[1]}/{name}.npz")
  loaded = tf.saved_model.load(f"{sys.argv[1]}/{name}")
  out = tf.nest.flatten(loaded(tf.constant(data["x"])))
  serving = loaded.signatures["serving_default"]
  by_signature = list(serving(tf.constant(data["x"])).values())
  np.savez(f"{sys.argv[1]}/{name}_out.npz", *[o.numpy() for o in out],
           signature=by_signature[0].numpy())
print("ok")
"""


def test_saved_model_runs_where_torch_cannot_be_imported(tmp_path):
  names = ["mlp", "cnn", "lstm", "encoder", "gpt2"]
  for name in names:
    _, served = _translated(name)
    tf.saved_model.save(served, str(tmp_path / name))
    np.savez(tmp_path / f"{name}.npz", x=_inputs(name, batch=3)[0])
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run(
    [sys.executable, "-c", _LOAD_WITHOUT_TORCH, str(tmp_path)] + names,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
  for name in names:
    actor, _ = _translated(name)
    want = _torch_outputs(actor, _inputs(name, batch=3))
    got = np.load(tmp_path / f"{name}_out.npz")
    for k, w in enumerate(want):
      np.testing.assert_allclose(got[f"arr_{k}"], w, **F32)
    np.testing.assert_allclose(got["signature"], want[0], **F32)


# tf.lite.Interpreter warns that it moves to the ai_edge_litert package.
@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_tflite_converts_and_matches(name):
  actor, served = _translated(name)
  converter = tf.lite.TFLiteConverter.from_concrete_functions(
    [served.__call__.get_concrete_function()], served
  )
  interpreter = tf.lite.Interpreter(model_content=converter.convert())
  x = _inputs(name, batch=4)[0]
  detail = interpreter.get_input_details()[0]
  interpreter.resize_tensor_input(detail["index"], list(x.shape))
  interpreter.allocate_tensors()
  interpreter.set_tensor(detail["index"], x)
  interpreter.invoke()
  got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
  np.testing.assert_allclose(got, _torch_outputs(actor, [x])[0], rtol=1e-5, atol=1e-5)


def test_checkpoint_keys_are_the_torch_modules(tmp_path):
  actor, served = _translated("cnn")
  path = tf.train.Checkpoint(model=actor).write(str(tmp_path / "bridge"))
  inputs = [tf.constant(a) for a in _inputs("cnn")]
  want = served(*inputs)
  saved = actor.get_weights()
  try:
    for v in actor.variables:
      v.assign(tf.zeros_like(v))
    tf.train.Checkpoint(model=served).read(path).assert_consumed()
    np.testing.assert_array_equal(served(*inputs), want)
  finally:
    actor.set_weights(saved)


def test_exports_in_eval_mode_and_restores_the_modes():
  torch.manual_seed(2)
  module = torch.nn.Sequential(
    torch.nn.Linear(3, 8), torch.nn.Dropout(0.5), torch.nn.BatchNorm1d(8)
  ).train()
  actor = tb.TorchModule(module)
  served = translate(actor, [tf.TensorSpec([None, 3])])
  assert all(m.training for m in actor.torch_module.modules())
  x = np.random.randn(4, 3).astype(np.float32)
  want = actor(tf.constant(x), training=False)
  np.testing.assert_allclose(served(tf.constant(x)), want, **F32)


def test_cnn_stays_channels_last_between_ops():
  _, served = _translated("cnn")
  graph = served.__call__.get_concrete_function().graph
  transposes = [op for op in graph.get_operations() if op.type == "Transpose"]
  # One per conv weight (2), one into NHWC, one back to NCHW before Flatten
  # (the Linear reads its weight through transpose_b): none around
  # BatchNorm, ReLU or the pools.
  assert len(transposes) == 4, [op.name for op in transposes]


def test_dynamic_sequence_length():
  actor, served = _translated("encoder")
  for length in (2, 7):
    x = np.random.randn(3, length, 8).astype(np.float32)
    _assert_close(served(tf.constant(x)), _torch_outputs(actor, [x]), F32)


def test_torch_layer_translates_with_its_variables():
  torch.manual_seed(1)
  layer = tb.keras.TorchLayer(torch.nn.Linear(3, 2), name="lin")
  served = translate(layer, [tf.TensorSpec([None, 3])])
  assert {id(v) for v in served.variables} == {id(w.value) for w in layer.weights}
  layer.weights[0].assign(tf.ones_like(layer.weights[0]))
  x = np.random.randn(4, 3).astype(np.float32)
  np.testing.assert_allclose(served(tf.constant(x)), layer(tf.constant(x)).numpy(), **F32)


class _Unsupported(torch.nn.Module):
  def forward(self, x):
    return torch.cumprod(x, 1) + torch.sort(x, 1).values + torch.relu(x)


def test_untranslated_ops_are_listed_in_one_error():
  actor = tb.TorchModule(_Unsupported(), name="odd")
  with pytest.raises(UntranslatedOpsError) as err:
    translate(actor, [tf.TensorSpec([None, 3])])
  message = str(err.value)
  assert "2 op(s)" in message
  assert "aten.cumprod.default" in message and "aten.sort.default" in message
  assert "relu" not in message
  assert "through the bridge" in message
  assert set(err.value.ops) == {"aten.cumprod.default", "aten.sort.default"}


def test_a_translation_that_raises_is_reported_as_a_bug_not_a_missing_op(monkeypatch):
  def broken(out, x):
    raise ValueError("boom")

  _, layout, refuse = _table.OPS["aten.relu.default"]
  monkeypatch.setitem(_table.OPS, "aten.relu.default", (broken, layout, refuse))
  actor = tb.TorchModule(torch.nn.Sequential(torch.nn.ReLU()), name="buggy")
  with pytest.raises(RuntimeError) as err:
    translate(actor, [tf.TensorSpec([None, 3])])
  assert not isinstance(err.value, UntranslatedOpsError)
  message = str(err.value)
  assert "aten.relu.default (node 'relu')" in message and "ValueError: boom" in message
  assert "bug" in message and "not a missing op" in message


def test_a_refusal_met_while_running_names_the_op():
  pool = torch.nn.MaxPool2d(2, return_indices=True)

  class Indices(torch.nn.Module):
    def forward(self, x):
      return pool(x)[1].float()

  with pytest.raises(UntranslatedOpsError) as err:
    translate(tb.TorchModule(Indices(), name="indices"), [tf.TensorSpec([None, 1, 4, 4])])
  [(where, why)] = err.value.ops.items()
  assert where == "operator.getitem (node 'getitem_1')", where
  assert "max_pool2d's indices" in why
  assert where in str(err.value)


class _FlattenThenLinear(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(8, 4)

  def forward(self, x):  # TF cannot know the -1 dimension statically
    return self.lin(x.reshape(x.shape[0], x.shape[1], -1))


@pytest.mark.parametrize(
  "module, spec",
  [
    (_FlattenThenLinear, [None, 3, 2, 4]),
    (lambda: torch.nn.Softmax(0), []),
    (lambda: torch.nn.LogSoftmax(0), []),
  ],
  ids=["linear_after_reshape", "softmax_0d", "log_softmax_0d"],
)
def test_shapes_the_coverage_run_found(module, spec):
  torch.manual_seed(0)
  actor = tb.TorchModule(module().eval(), name="found")
  served = translate(actor, [tf.TensorSpec(spec)])
  x = np.random.default_rng(0).standard_normal([2 if d is None else d for d in spec])
  x = x.astype(np.float32)
  with torch.no_grad():
    want = actor.torch_module(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(served(tf.constant(x)).numpy(), want, **F32)


def test_parity_error_names_the_difference(monkeypatch):
  fn, layout, refuse = _table.OPS["aten.relu.default"]
  monkeypatch.setitem(
    _table.OPS, "aten.relu.default", (lambda out, x: fn(out, x) * 1.001, layout, refuse)
  )
  actor = tb.TorchModule(torch.nn.Sequential(torch.nn.ReLU()), name="wrong")
  with pytest.raises(ParityError, match=r"output 0: .* <- over tolerance"):
    translate(actor, [tf.TensorSpec([None, 3])])


class _FixedBatch(torch.nn.Module):
  def forward(self, x):
    return x * torch.ones(2, 1)  # broadcasting pins the batch size to 2


@pytest.mark.parametrize(
  "signature, error, match",
  [
    ("not a spec", TypeError, r"expected a list of tf.TensorSpec.*Example"),
    ([tf.TensorSpec(None)], ValueError, r"unknown rank"),
  ],
)
def test_bad_input_signature(signature, error, match):
  actor = tb.TorchModule(torch.nn.Linear(3, 2))
  with pytest.raises(error, match=match):
    translate(actor, signature)


def test_refuses_what_is_not_a_torch_module():
  with pytest.raises(TypeError, match=r"tb.TorchModule or tb.keras.TorchLayer"):
    translate(torch.nn.Linear(3, 2), [tf.TensorSpec([None, 3])])


def test_a_batch_size_the_model_fixes_is_refused():
  actor = tb.TorchModule(_FixedBatch())
  with pytest.raises(
    ValueError,
    match=r"input 0 .* dimension 0, but "
    r"torch.export specialized it to 2",
  ):
    translate(actor, [tf.TensorSpec([None, 3])])


def test_a_batch_of_one_in_the_examples_is_named_as_the_cause():
  actor = tb.TorchModule(torch.nn.Linear(3, 2), name="lin")
  with pytest.raises(
    ValueError,
    match=r"specialized it to 1: torch.export "
    r"fixes every dimension of size 1 in the example inputs, "
    r"so pass example_inputs with a size >= 2 there",
  ):
    translate(actor, [tf.TensorSpec([None, 3])], example_inputs=[np.ones([1, 3], np.float32)])


def test_recurrent_layer_needs_a_fixed_sequence_length():
  actor = tb.TorchModule(torch.nn.GRU(3, 4, batch_first=True))
  # torch.export itself fixes the time dimension of nn.GRU / nn.LSTM.
  with pytest.raises(
    ValueError,
    match=r"dynamic size in dimension 1, but "
    r"torch.export specialized it to 3.*give it in the spec",
  ):
    translate(actor, [tf.TensorSpec([None, None, 3])])


def test_linear_reads_its_weight_without_a_transpose():
  # A transposed variable in a nested function makes XLA recompile a
  # jit-compiled training step on every call (TF 2.21): linear uses
  # matmul's transpose_b instead.
  _, served = _translated("mlp")
  graph = served.__call__.get_concrete_function().graph
  kinds = {op.type for op in graph.get_operations()}
  assert "MatMul" in kinds and "Transpose" not in kinds


def test_inside_a_function_the_ops_go_in_directly():
  actor, served = _translated("cnn")
  opt = tf.keras.optimizers.SGD(0.0)  # a jit step that updates, unchanged weights

  @tf.function(jit_compile=True)
  def step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(served(x)))
    grads = tape.gradient(loss, actor.trainable_variables)
    opt.apply_gradients(zip(grads, actor.trainable_variables))
    return loss

  x = tf.constant(_inputs("cnn")[0])
  graph = step.get_concrete_function(x).graph
  kinds = {op.type for op in graph.get_operations()}
  assert not kinds & {"PartitionedCall", "StatefulPartitionedCall"}, kinds
  want = float(tf.reduce_sum(tf.square(served(x))))  # eager: served's function
  for _ in range(2):
    np.testing.assert_allclose(float(step(x)), want, rtol=1e-5)
  with pytest.raises(
    TypeError,
    match=r"input 0 is float32 \(5, 7\), which "
    r"does not match its input_signature",
  ):
    tf.function(lambda y: served(y))(tf.zeros([5, 7]))


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("rank", [2, 3])
def test_linear_reads_the_weight_in_torchs_layout_in_the_form_each_compiler_runs_fastest(jit, rank):
  # Under XLA `x @ W.T` is written `(W @ x.T).T` (faster on XLA's CPU
  # dots: benchmarks/weight_layout.py); without XLA it stays one MatMul
  # with transpose_b. Either way the numbers and the gradients are torch's.
  torch.manual_seed(0)
  linear = torch.nn.Linear(6, 4)
  actor = tb.TorchModule(linear, name="linear")
  shape = [3, 6] if rank == 2 else [2, 3, 6]
  served = translate(actor, [tf.TensorSpec(shape, tf.float32)])
  x_np = np.random.default_rng(rank).standard_normal(shape).astype(np.float32)

  @tf.function(jit_compile=jit)
  def forward_backward(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = served(x)
      loss = tf.reduce_sum(y * tf.range(1.0, 5.0))
    return (y, *tape.gradient(loss, [x, *actor.trainable_variables]))

  x_torch = torch.from_numpy(x_np).requires_grad_()
  y_torch = linear(x_torch)
  (y_torch * torch.arange(1.0, 5.0)).sum().backward()
  want = [y_torch, x_torch.grad, linear.weight.grad, linear.bias.grad]
  got = forward_backward(tf.constant(x_np))
  by_name = {
    v.name.split(":")[0].split("/")[-1]: i for i, v in enumerate(actor.trainable_variables)
  }
  order = [0, 1, 2 + by_name["weight"], 2 + by_name["bias"]]
  for i, w in zip(order, want):
    np.testing.assert_allclose(got[i].numpy(), w.detach().numpy(), rtol=1e-5, atol=1e-5)
  graph = forward_backward.get_concrete_function(tf.constant(x_np)).graph
  matmuls = [
    op
    for g in [graph, *(f.graph for f in graph._functions.values() if hasattr(f, "graph"))]
    for op in g.get_operations()
    if op.type == "MatMul"
  ]
  forward = [op for op in matmuls if op.inputs[0].shape == [4, 6] or op.inputs[1].shape == [4, 6]]
  forward = [op for op in forward if op.get_attr("transpose_b")]
  assert len(forward) == 1, [(op.inputs[0].shape, op.inputs[1].shape) for op in matmuls]
  weight_first = forward[0].inputs[0].shape == [4, 6]
  assert weight_first == jit


class _MaskedAttention(torch.nn.Module):
  def __init__(self, additive):
    super().__init__()
    self.project = torch.nn.Linear(4, 12)
    self.additive = additive

  def forward(self, x, keep):
    q, k, v = self.project(x).chunk(3, dim=-1)
    mask = keep[:, None, :].bool()
    if self.additive:  # -inf where blocked
      mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("additive", [False, True])
def test_attention_gives_zeros_for_a_query_that_may_attend_nothing(additive):
  """torch's attention returns zeros for a fully masked row (a sequence all
  padding); a softmax over nothing would give the mean of the values, or
  NaN."""
  torch.manual_seed(0)
  net = _MaskedAttention(additive).eval()
  x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
  keep = np.array([[1, 1, 0], [0, 0, 0]], np.float32)
  served = tb.translate(
    tb.TorchModule(net, name="masked"),
    [tf.TensorSpec([None, 3, 4]), tf.TensorSpec([None, 3])],
    example_inputs=[x, keep],
  )
  got = served(tf.constant(x), tf.constant(keep)).numpy()
  want = net(torch.from_numpy(x), torch.from_numpy(keep)).detach().numpy()
  assert not np.any(want[1]) and np.any(want[0])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
