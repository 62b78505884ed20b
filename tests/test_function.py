"""`tb.torch_function`: calls, nests, static arguments, shapes and gradients.

Most tests run as a matrix: eagerly and inside `tf.function` (the `mode` /
`in_mode` fixtures), in float32 and float64 (`float_dtype`).
"""

import collections
import functools
import gc
import weakref

import numpy as np
import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from torchbridge._native import _op
from conftest import random_tf
from conftest import tolerance

Pair = collections.namedtuple("Pair", ["first", "second"])


def as_torch_leaf(x_tf):
  """An independent torch copy of a TF tensor that requires grad."""
  return torch.from_numpy(np.array(x_tf.numpy())).requires_grad_()


def counting(fn):
  """`fn` plus a count of its calls on real (not meta) tensors."""
  calls = {"real": 0, "meta": 0}

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    leaves = [a for a in tf.nest.flatten((args, kwargs)) if isinstance(a, torch.Tensor)]
    calls["meta" if any(a.is_meta for a in leaves) else "real"] += 1
    return fn(*args, **kwargs)

  return wrapper, calls


# --- Forms of the API. ---


def test_decorator_forms_and_metadata():
  @tb.torch_function
  def plain(a):
    """Doubles."""
    return a * 2

  @tb.torch_function(name="named op")
  def named(a):
    return a * 3

  def raw(a):
    return a * 4

  called = tb.torch_function(raw)
  x = tf.constant([1.0, 2.0])
  np.testing.assert_array_equal(plain(x).numpy(), [2.0, 4.0])
  np.testing.assert_array_equal(named(x).numpy(), [3.0, 6.0])
  np.testing.assert_array_equal(called(x).numpy(), [4.0, 8.0])
  assert plain.__name__ == "plain" and plain.__doc__ == "Doubles."
  assert called.__wrapped__ is raw

  @tf.function
  def graph(x):
    return named(x)

  ops = [op.type for op in graph.get_concrete_function(x).graph.get_operations()]
  assert ("TorchbridgeCall" if tb.native_available() else "EagerPyFunc") in ops
  np.testing.assert_array_equal(graph(x).numpy(), [3.0, 6.0])


def test_not_callable_is_rejected():
  with pytest.raises(TypeError) as info:
    tb.torch_function(42)
  message = str(info.value)
  assert "torch_function()" in message and "callable" in message
  assert "int" in message and "@tb.torch_function" in message


def test_bad_output_signature_is_rejected():
  with pytest.raises(TypeError) as info:
    tb.torch_function(lambda a: a, output_signature=[tf.float32])
  assert "output_signature" in str(info.value)
  assert "tf.TensorSpec" in str(info.value)


def test_decorated_method(in_mode):
  class Scaler:
    def __init__(self, scale):
      self.scale = scale

    @tb.torch_function
    def apply(self, a):
      return a * self.scale

  scaler = Scaler(5.0)
  x = tf.constant([1.0, -2.0])
  out = in_mode(lambda x: scaler.apply(x))(x)
  np.testing.assert_array_equal(out.numpy(), [5.0, -10.0])


# --- Nests of inputs and outputs, static arguments. ---


def test_nested_inputs_and_outputs(in_mode, float_dtype):
  @tb.torch_function
  def fn(inputs, pair, scale, op, offset, *, power=1):
    assert isinstance(inputs, dict) and isinstance(pair, Pair)
    assert isinstance(scale, float) and isinstance(op, str)
    assert isinstance(offset, torch.Tensor)
    combined = getattr(torch, op)(inputs["a"]) * scale + pair.first[0]
    return {
      "combined": combined**power,
      "pair": Pair(
        first=[pair.first[1].sum(), None], second=inputs["idx"] * 2 + offset.to(torch.int64)
      ),
    }

  a = random_tf([3, 4], float_dtype, seed=1)
  b = random_tf([3, 4], float_dtype, seed=2)
  c = random_tf([5], float_dtype, seed=3)
  idx = tf.constant([3, 1, 2], tf.int64)
  offset_torch = torch.tensor(10)

  def call(a, b, c, idx):
    return fn(
      {"a": a, "idx": idx}, Pair(first=[b, c], second=None), 0.5, "cos", offset_torch, power=2
    )

  out = in_mode(call)(a, b, c, idx)
  assert set(out) == {"combined", "pair"}
  assert isinstance(out["pair"], Pair)
  assert isinstance(out["pair"].first, list) and out["pair"].first[1] is None
  assert out["combined"].dtype == float_dtype
  assert out["pair"].second.dtype == tf.int64
  expected = (np.cos(a.numpy()) * 0.5 + b.numpy()) ** 2
  np.testing.assert_allclose(out["combined"].numpy(), expected, **tolerance(float_dtype))
  np.testing.assert_allclose(
    out["pair"].first[0].numpy(), c.numpy().sum(), **tolerance(float_dtype)
  )
  np.testing.assert_array_equal(out["pair"].second.numpy(), [16, 12, 14])


def test_numbers_in_the_result_become_tf_scalars(in_mode):
  # Python and numpy numbers come back as scalars of torch's dtype for them.
  @tb.torch_function
  def fn(x):
    return {
      "sum": x.sum(),
      "count": int(x.shape[0]),
      "scale": 0.5,
      "flag": True,
      "np": np.int32(7),
      "none": None,
    }

  out = in_mode(fn)(tf.constant([1.0, 2.0, 4.0]))
  assert out["none"] is None
  assert (out["count"].dtype, out["scale"].dtype, out["flag"].dtype, out["np"].dtype) == (
    tf.int64,
    tf.float32,
    tf.bool,
    tf.int32,
  )
  assert all(out[k].shape == () for k in ("count", "scale", "flag", "np"))
  assert (
    out["sum"].numpy(),
    out["count"].numpy(),
    out["scale"].numpy(),
    out["flag"].numpy(),
    out["np"].numpy(),
  ) == (7.0, 3, 0.5, True, 7)


def test_a_result_that_is_not_a_tensor_or_number_is_refused(in_mode):
  fn = tb.torch_function(lambda x: (x, "label"), name="labelled")
  with pytest.raises(
    TypeError,
    match=r"labelled returned a str \('label'\) "
    r"inside its result; torchbridge passes back torch "
    r"tensors, numbers \(or None\) only",
  ):
    in_mode(fn)(tf.constant([1.0]))


def test_static_arguments_select_the_computation(in_mode):
  @tb.torch_function
  def apply(x, op, scale=1.0):
    return getattr(torch, op)(x) * scale

  x = tf.constant([0.25, 0.5], tf.float64)
  sin = in_mode(lambda x: apply(x, "sin", scale=3.0))(x)
  exp = in_mode(lambda x: apply(x, op="exp"))(x)
  np.testing.assert_allclose(sin.numpy(), 3 * np.sin([0.25, 0.5]), rtol=1e-15)
  np.testing.assert_allclose(exp.numpy(), np.exp([0.25, 0.5]), rtol=1e-15)


def test_variables_and_numpy_arrays_are_tensor_inputs(in_mode, float_dtype):
  @tb.torch_function
  def fn(v, n):
    return v * n

  v = tf.Variable(random_tf([4], float_dtype, seed=4))
  n = np.arange(4).astype(float_dtype.as_numpy_dtype)

  def step():
    with tf.GradientTape() as tape:
      y = tf.reduce_sum(fn(v, n))
    return y, tape.gradient(y, v)

  y, grad = in_mode(step)()
  np.testing.assert_allclose(y.numpy(), (v.numpy() * n).sum(), **tolerance(float_dtype))
  np.testing.assert_allclose(grad.numpy(), n, **tolerance(float_dtype))


def test_no_tensor_arguments(in_mode):
  @tb.torch_function
  def arange(n):
    return torch.arange(n, dtype=torch.float32)

  out = in_mode(lambda: arange(4))()
  np.testing.assert_array_equal(out.numpy(), [0.0, 1.0, 2.0, 3.0])


def test_all_shared_output_dtypes(in_mode):
  @tb.torch_function
  def many(x):
    return [
      x.to(dtype)
      for dtype in (
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
      )
    ]

  outs = in_mode(many)(tf.constant([0.0, 1.0, 2.0]))
  assert [o.dtype for o in outs] == [
    tf.float16,
    tf.bfloat16,
    tf.float64,
    tf.int8,
    tf.int32,
    tf.int64,
    tf.uint8,
    tf.bool,
    tf.complex64,
  ]
  for out in outs:
    np.testing.assert_array_equal(
      tf.cast(out, tf.float32).numpy(), [0.0, 1.0, 1.0 if out.dtype == tf.bool else 2.0]
    )


def _tf_buffer_address(x_tf):
  """Address of a TF tensor's buffer, read through a DLPack view of it."""
  return torch.utils.dlpack.from_dlpack(tf.experimental.dlpack.to_dlpack(x_tf)).data_ptr()


@pytest.mark.usefixtures("own_crossings_only")
def test_activations_cross_without_copies():
  seen = {}

  @tb.torch_function
  def fn(a, b):
    out, product = a + b, a * b
    if not a.is_meta:  # shapes may be found on meta tensors first
      seen.update(a=a.data_ptr(), b=b.data_ptr(), out=out, product=product.data_ptr())
    return out, product.t()  # the second output is transposed in torch

  a = tf.ones([8, 16])
  out, transposed = fn(a, a)
  assert tb.exchange_stats() == {"zero_copy": 3, "copied": 1, "bytes_copied": 8 * 16 * 4}
  np.testing.assert_array_equal(transposed.numpy(), np.ones([16, 8]))
  np.testing.assert_array_equal(out.numpy(), np.full([8, 16], 2.0))
  # Zero copy by memory identity: torch saw TF's input buffer, and TF's
  # first output is the buffer torch wrote; the transposed one is a copy.
  assert seen["a"] == seen["b"] == _tf_buffer_address(a)
  assert _tf_buffer_address(out) == seen["out"].data_ptr()
  assert _tf_buffer_address(transposed) != seen["product"]
  # Writing through torch's output shows in TF's: one buffer.
  seen["out"].fill_(-3.0)
  np.testing.assert_array_equal(out.numpy(), np.full([8, 16], -3.0))


def test_inputs_are_views_of_tf_memory():
  seen = {}

  @tb.torch_function
  def fn(a):
    seen["ptr"] = a.data_ptr()
    return a + 1

  x = tf.identity(tf.random.normal([64]))
  fn(x)
  assert seen["ptr"] == tb.to_torch(x).data_ptr()


# --- Gradients, checked three ways. ---


def sin_mix(a, b, w):
  """Torch: several outputs mixing all inputs."""
  return {"y": torch.sin(a) * b, "z": torch.tanh(a @ w)}


def test_gradients_match_torch_autograd(in_mode, float_dtype):
  a = random_tf([3, 4], float_dtype, seed=5)
  b = random_tf([3, 4], float_dtype, seed=6)
  w = random_tf([4, 2], float_dtype, seed=7)
  u_y = random_tf([3, 4], float_dtype, seed=8)
  u_z = random_tf([3, 2], float_dtype, seed=9)
  bridged = tb.torch_function(sin_mix)

  def step(a, b, w):
    with tf.GradientTape() as tape:
      tape.watch([a, b, w])
      out = bridged(a, b, w)
      loss = tf.reduce_sum(out["y"] * u_y) + tf.reduce_sum(out["z"] * u_z)
    return out, tape.gradient(loss, [a, b, w])

  out_tf, grads_tf = in_mode(step)(a, b, w)

  leaves = [as_torch_leaf(t) for t in (a, b, w)]
  out_torch = sin_mix(*leaves)
  loss_torch = (out_torch["y"] * tb.to_torch(u_y)).sum() + (out_torch["z"] * tb.to_torch(u_z)).sum()
  grads_torch = torch.autograd.grad(loss_torch, leaves)
  for key in ("y", "z"):
    np.testing.assert_allclose(
      out_tf[key].numpy(), out_torch[key].detach().numpy(), **tolerance(float_dtype)
    )
  for grad_tf, grad_torch in zip(grads_tf, grads_torch):
    assert grad_tf.dtype == float_dtype
    np.testing.assert_allclose(grad_tf.numpy(), grad_torch.numpy(), **tolerance(float_dtype))


@pytest.mark.parametrize("case", ["sin_mul", "softmax", "mlp"])
def test_gradients_match_numerical_jacobian(mode, case):
  w1 = random_tf([3, 5], tf.float64, seed=10)
  w2 = random_tf([5, 2], tf.float64, seed=11)

  @tb.torch_function
  def fn(x, y):
    if case == "sin_mul":
      return torch.sin(x) * y
    if case == "softmax":
      return torch.softmax(x * y, dim=-1)
    w1_torch, w2_torch = tb.to_torch(w1), tb.to_torch(w2)
    return torch.tanh(x @ w1_torch) @ w2_torch + y[:, :2]

  f = fn if mode == "eager" else tf.function(fn)
  x = random_tf([2, 3], tf.float64, seed=12)
  y = random_tf([2, 3], tf.float64, seed=13)
  theoretical, numerical = tf.test.compute_gradient(f, [x, y])
  for analytic, numeric in zip(theoretical, numerical):
    assert np.abs(analytic).max() > 0.01
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7)


def mlp_torch(x, w1, b1, w2, b2):
  return torch.tanh(x @ w1 + b1) @ w2 + b2


def mlp_tf(x, w1, b1, w2, b2):
  return tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) + b2


def mlp_params(dtype):
  return [
    random_tf([6, 4], dtype, seed=20),
    random_tf([4, 8], dtype, seed=21),
    random_tf([8], dtype, seed=22),
    random_tf([8, 3], dtype, seed=23),
    random_tf([3], dtype, seed=24),
  ]


def test_mlp_matches_tf_native(in_mode, float_dtype):
  params = mlp_params(float_dtype)
  bridged = tb.torch_function(mlp_torch)

  def step(*params):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(params)
      out_bridged = bridged(*params)
      out_native = mlp_tf(*params)
      loss_bridged = tf.reduce_sum(tf.square(out_bridged))
      loss_native = tf.reduce_sum(tf.square(out_native))
    return (
      out_bridged,
      out_native,
      tape.gradient(loss_bridged, params),
      tape.gradient(loss_native, params),
    )

  out_b, out_n, grads_b, grads_n = in_mode(step)(*params)
  np.testing.assert_allclose(out_b.numpy(), out_n.numpy(), **tolerance(float_dtype))
  for grad_b, grad_n in zip(grads_b, grads_n):
    np.testing.assert_allclose(grad_b.numpy(), grad_n.numpy(), **tolerance(float_dtype))


def test_sin_mul_matches_tf_native(in_mode, float_dtype):
  a = random_tf([5], float_dtype, seed=30)
  b = random_tf([5], float_dtype, seed=31)
  bridged = tb.torch_function(lambda a, b: torch.sin(a) * b)

  def step(a, b):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch([a, b])
      y_bridged = bridged(a, b)
      y_native = tf.sin(a) * b
    return (y_bridged, y_native, tape.gradient(y_bridged, [a, b]), tape.gradient(y_native, [a, b]))

  y_b, y_n, grads_b, grads_n = in_mode(step)(a, b)
  np.testing.assert_allclose(y_b.numpy(), y_n.numpy(), **tolerance(float_dtype))
  for grad_b, grad_n in zip(grads_b, grads_n):
    np.testing.assert_allclose(grad_b.numpy(), grad_n.numpy(), **tolerance(float_dtype))


def test_integer_inputs_get_no_gradient(in_mode, float_dtype):
  @tb.torch_function
  def gather(x, idx, mask):
    return x[idx] * 2 * mask.to(x.dtype)

  x = random_tf([4], float_dtype, seed=32)
  idx = tf.constant([0, 2, 2], tf.int64)
  mask = tf.constant([True, True, False])

  def step(x, idx, mask):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.reduce_sum(gather(x, idx, mask))
    return tape.gradient(y, [x, idx, mask])

  grad_x, grad_idx, grad_mask = in_mode(step)(x, idx, mask)
  np.testing.assert_array_equal(grad_x.numpy(), [2.0, 0.0, 2.0, 0.0])
  assert grad_idx is None
  assert grad_mask is None


def test_outputs_the_loss_ignores_contribute_zero(in_mode, float_dtype):
  @tb.torch_function
  def several(a):
    return {"double": a * 2, "triple": a * 3, "detached": a.detach() * 5, "argmax": torch.argmax(a)}

  a = random_tf([4], float_dtype, seed=33)

  def step(a):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(a)
      out = several(a)
      only_double = tf.reduce_sum(out["double"])
      with_detached = only_double + tf.reduce_sum(out["detached"])
      with_argmax = only_double + tf.cast(out["argmax"], float_dtype)
    return [tape.gradient(loss, a) for loss in (only_double, with_detached, with_argmax)]

  for grad in in_mode(step)(a):
    np.testing.assert_array_equal(grad.numpy(), np.full([4], 2.0))


def test_low_precision_gradients(in_mode):
  @tb.torch_function
  def fn(a):
    return a * a

  for dtype in (tf.float16, tf.bfloat16):
    a = tf.constant([1.0, 2.0, -3.0], dtype)

    def step(a):
      with tf.GradientTape() as tape:
        tape.watch(a)
        y = tf.reduce_sum(fn(a))
      return tape.gradient(y, a)

    grad = in_mode(step)(a)
    assert grad.dtype == dtype
    np.testing.assert_array_equal(tf.cast(grad, tf.float32).numpy(), [2.0, 4.0, -6.0])


# --- Higher-order gradients. ---


def second_order(fn, a, b):
  """First and second derivatives of sum(fn(a, b)) w.r.t. a, and d/db."""
  with tf.GradientTape(persistent=True) as outer:
    outer.watch([a, b])
    with tf.GradientTape() as inner:
      inner.watch(a)
      y = tf.reduce_sum(fn(a, b))
    dy_da = inner.gradient(y, a)
  return dy_da, outer.gradient(dy_da, a), outer.gradient(dy_da, b)


def assert_sin_mul_derivatives(a, b, dy_da, d2y_da2, d2y_dadb, dtype):
  a, b = a.numpy(), b.numpy()
  np.testing.assert_allclose(dy_da.numpy(), np.cos(a) * b, **tolerance(dtype))
  np.testing.assert_allclose(d2y_da2.numpy(), -np.sin(a) * b, **tolerance(dtype))
  np.testing.assert_allclose(d2y_dadb.numpy(), np.cos(a), **tolerance(dtype))


@pytest.mark.parametrize("where", ["eager", "inside_tf_function", "eager_tapes_around_tf_function"])
def test_second_order_gradients(where, float_dtype):
  fn, calls = counting(lambda a, b: torch.sin(a) * b)
  bridged = tb.torch_function(fn)
  a = random_tf([6], float_dtype, seed=40)
  b = random_tf([6], float_dtype, seed=41)
  if where == "eager":
    results = second_order(bridged, a, b)
  elif where == "inside_tf_function":
    results = tf.function(second_order, reduce_retracing=True)(bridged, a, b)
  else:
    results = second_order(tf.function(bridged), a, b)
  assert_sin_mul_derivatives(a, b, *results, float_dtype)
  assert calls["real"] == 1  # the forward ran once


def test_gradient_of_a_tf_function_that_returns_a_gradient():
  bridged = tb.torch_function(lambda a, b: torch.sin(a) * b)
  a = random_tf([4], tf.float64, seed=46)
  b = random_tf([4], tf.float64, seed=47)

  @tf.function
  def first_derivative(a, b):
    with tf.GradientTape() as tape:
      tape.watch(a)
      y = tf.reduce_sum(bridged(a, b))
    return tape.gradient(y, a)

  with tf.GradientTape() as outer:
    outer.watch([a, b])
    dy_da = first_derivative(a, b)
  d2y_da2, d2y_dadb = outer.gradient(dy_da, [a, b])
  assert_sin_mul_derivatives(a, b, dy_da, d2y_da2, d2y_dadb, tf.float64)


def test_second_order_after_first_order_on_the_same_tf_function():
  fn, calls = counting(lambda a, b: torch.sin(a) * b)
  traced = tf.function(tb.torch_function(fn))
  a = random_tf([4], tf.float64, seed=48)
  b = random_tf([4], tf.float64, seed=49)
  with tf.GradientTape() as tape:
    tape.watch(a)
    y = tf.reduce_sum(traced(a, b))
  np.testing.assert_allclose(tape.gradient(y, a).numpy(), np.cos(a.numpy()) * b.numpy(), rtol=1e-12)
  # The backward TF built for first order is reused; second order must still
  # be right.
  assert_sin_mul_derivatives(a, b, *second_order(traced, a, b), tf.float64)
  assert calls["real"] == 2


def test_gradients_with_unknown_batch_dimension():
  bridged = tb.torch_function(lambda a, b: torch.sin(a) * b)
  spec = tf.TensorSpec([None, 2], tf.float64)
  traced = tf.function(lambda a, b: second_order(bridged, a, b), input_signature=[spec, spec])
  for batch in (3, 5):
    a = random_tf([batch, 2], tf.float64, seed=batch)
    b = random_tf([batch, 2], tf.float64, seed=batch + 1)
    assert_sin_mul_derivatives(a, b, *traced(a, b), tf.float64)


def test_third_order_gradient(in_mode):
  bridged = tb.torch_function(lambda a, b: torch.sin(a) * b)
  a = random_tf([5], tf.float64, seed=42)
  b = random_tf([5], tf.float64, seed=43)

  def step(a, b):
    with tf.GradientTape() as t3:
      t3.watch(a)
      with tf.GradientTape() as t2:
        t2.watch(a)
        with tf.GradientTape() as t1:
          t1.watch(a)
          y = tf.reduce_sum(bridged(a, b))
        g1 = t1.gradient(y, a)
      g2 = t2.gradient(g1, a)
    return t3.gradient(g2, a)

  np.testing.assert_allclose(
    in_mode(step)(a, b).numpy(), -np.cos(a.numpy()) * b.numpy(), rtol=1e-12
  )


def test_gradient_penalty_matches_tf_native(in_mode, float_dtype):
  params = mlp_params(float_dtype)
  bridged = tb.torch_function(mlp_torch)

  def penalty_grads(model, x, *weights):
    with tf.GradientTape() as outer:
      outer.watch(weights)
      with tf.GradientTape() as inner:
        inner.watch(x)
        y = tf.reduce_sum(tf.sin(model(x, *weights)))
      dy_dx = inner.gradient(y, x)
      penalty = tf.reduce_sum(tf.square(dy_dx))
    return penalty, outer.gradient(penalty, list(weights))

  p_b, grads_b = in_mode(functools.partial(penalty_grads, bridged))(*params)
  p_n, grads_n = in_mode(functools.partial(penalty_grads, mlp_tf))(*params)
  np.testing.assert_allclose(p_b.numpy(), p_n.numpy(), **tolerance(float_dtype))
  for grad_b, grad_n in zip(grads_b, grads_n):
    grad_n = np.zeros_like(grad_b) if grad_n is None else grad_n.numpy()
    np.testing.assert_allclose(grad_b.numpy(), grad_n, **tolerance(float_dtype))
  assert np.abs(grads_b[0].numpy()).max() > 1e-3


def test_persistent_tape_asked_twice(in_mode, float_dtype):
  fn, calls = counting(lambda a, b: torch.sin(a) * b)
  bridged = tb.torch_function(fn)
  a = random_tf([4], float_dtype, seed=44)
  b = random_tf([4], float_dtype, seed=45)

  def step(a, b):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch([a, b])
      y = tf.reduce_sum(bridged(a, b))
    first = tape.gradient(y, a)
    second = tape.gradient(y, a)
    both = tape.gradient(y, [a, b])
    return first, second, both

  first, second, (again_a, grad_b) = in_mode(step)(a, b)
  expected_a = np.cos(a.numpy()) * b.numpy()
  for grad in (first, second, again_a):
    np.testing.assert_allclose(grad.numpy(), expected_a, **tolerance(float_dtype))
  np.testing.assert_allclose(grad_b.numpy(), np.sin(a.numpy()), **tolerance(float_dtype))
  assert calls["real"] == 1


def test_backward_never_reruns_forward(mode, in_mode):
  fn, calls = counting(lambda a: torch.exp(a) * 2)
  bridged = tb.torch_function(fn)
  a = tf.constant([0.5, 1.0], tf.float64)

  def step(a):
    with tf.GradientTape() as tape:
      tape.watch(a)
      y = tf.reduce_sum(bridged(a))
    return tape.gradient(y, a)

  step = in_mode(step)
  for n in range(1, 4):
    grad = step(a)
    np.testing.assert_allclose(grad.numpy(), 2 * np.exp([0.5, 1.0]), rtol=1e-14)
    assert calls["real"] == n
  # Shape inference runs the code once per trace, on meta tensors only.
  assert calls["meta"] == (0 if mode == "eager" else 1)


def test_shape_inference_runs_once_per_trace():
  fn, calls = counting(lambda a: a * 2)
  bridged = tb.torch_function(fn)
  traced = tf.function(lambda a: bridged(a))
  for _ in range(3):
    traced(tf.ones([2]))
  assert calls == {"real": 3, "meta": 1}
  traced(tf.ones([3]))  # a new shape: TF retraces, and so does inference
  assert calls == {"real": 4, "meta": 2}


# --- Static shapes inside tf.function. ---


def test_static_shapes_fully_known():
  shapes = {}

  @tb.torch_function
  def fn(x, w):
    return {"h": x @ w, "s": (x @ w).sum(), "flat": x.reshape(-1), "cat": torch.cat([x, x], dim=0)}

  @tf.function
  def traced(x, w):
    out = fn(x, w)
    shapes.update({k: v.shape.as_list() for k, v in out.items()})
    return out

  out = traced(tf.ones([5, 3]), tf.ones([3, 4]))
  assert shapes == {"h": [5, 4], "s": [], "flat": [15], "cat": [10, 3]}
  assert out["h"].shape == (5, 4)


def test_unknown_batch_dimension_stays_unknown():
  shapes = {}
  w = tf.ones([3, 4])

  @tb.torch_function
  def fn(x, w):
    return {
      "h": x @ w,
      "per_feature": x.sum(dim=0),
      "total": x.sum(),
      "flat": x.reshape(-1),
      "cat": torch.cat([x, x], dim=0),
      "first": x[:1],
    }

  @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  def traced(x):
    out = fn(x, w)
    shapes.update({k: v.shape.as_list() for k, v in out.items()})
    return out

  out = traced(tf.ones([7, 3]))
  assert shapes == {
    "h": [None, 4],
    "per_feature": [3],
    "total": [],
    "flat": [None],
    "cat": [None, 3],
    "first": [1, 3],
  }
  assert out["h"].shape == (7, 4) and out["cat"].shape == (14, 3)
  assert traced(tf.ones([2, 3]))["flat"].shape == (6,)


def test_unknown_rank_needs_output_signature():
  bridged = tb.torch_function(lambda x: x * 2)
  traced = tf.function(lambda x: bridged(x), input_signature=[tf.TensorSpec(None, tf.float32)])
  with pytest.raises(ValueError) as info:
    traced.get_concrete_function()
  assert "unknown rank" in str(info.value)
  assert "tb.torch_function(..., output_signature=...)" in str(info.value)
  assert "tb.TorchModule(..., output_signature=...)" in str(info.value)

  declared = tb.torch_function(lambda x: x * 2, output_signature=tf.TensorSpec(None, tf.float32))
  traced = tf.function(lambda x: declared(x), input_signature=[tf.TensorSpec(None, tf.float32)])
  np.testing.assert_array_equal(traced(tf.ones([2, 2])).numpy(), np.full([2, 2], 2.0))


# --- output_signature. ---


def nonzero_values(x):
  """Output shape depends on the data, and it reads values (.item())."""
  count = int((x > 0).sum().item())
  return x[x > 0][:count] * 2


def test_code_that_cannot_run_on_meta_runs_on_stand_ins():
  # It reads values (.item()) and its output shape depends on them: the
  # output specs come from real runs on stand-in values while tracing, and
  # the data-dependent dimension stays unknown.
  runs = []
  bridged = tb.torch_function(
    lambda x: runs.append(x.is_meta) or nonzero_values(x), name="nonzero_values"
  )
  x = tf.constant([1.0, -1.0, 3.0])
  shapes = []

  @tf.function
  def traced(x):
    y = bridged(x)
    shapes.append(y.shape.as_list())
    return y

  np.testing.assert_array_equal(traced(x).numpy(), [2.0, 6.0])
  np.testing.assert_array_equal(traced(tf.constant([-1.0, 5.0, 1.0])).numpy(), [10.0, 2.0])
  assert shapes == [[None]]
  # Tracing: one meta run (failed), a run on ones, one on random values;
  # then the two calls.
  assert runs == [True, False, False, False, False]


def picky(x):
  """Reads a value (.item()) and fails on ones (a negative size)."""
  return torch.zeros(int(x.sum().item()) - 100)


def test_code_that_runs_neither_on_meta_nor_on_ones_names_output_signature():
  bridged = tb.torch_function(picky)
  with pytest.raises(RuntimeError) as info:
    tf.function(lambda x: bridged(x))(tf.constant([1.0, 2.0]))
  message = " ".join(str(info.value).split())
  assert "picky" in message
  assert "meta" in message and ".item()" in message
  assert "stand-in values (ones)" in message and "negative" in message
  assert "output_signature" in message
  # Declared, it runs.
  declared = tb.torch_function(picky, output_signature=tf.TensorSpec([None], tf.float32))
  out = tf.function(lambda x: declared(x))(tf.constant([60.0, 50.0]))
  assert out.shape == (10,)


def test_output_signature(mode, in_mode):
  shapes = []
  bridged = tb.torch_function(nonzero_values, output_signature=tf.TensorSpec([None], tf.float32))

  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = bridged(x)
      shapes.append(y.shape.as_list())
      loss = tf.reduce_sum(y * y)
    return y, tape.gradient(loss, x)

  y, grad = in_mode(step)(tf.constant([1.0, -1.0, 3.0]))
  np.testing.assert_array_equal(y.numpy(), [2.0, 6.0])
  np.testing.assert_array_equal(grad.numpy(), [8.0, 0.0, 24.0])
  # Inside tf.function the output carries the declared static shape.
  assert shapes == ([[2]] if mode == "eager" else [[None]])


def test_nested_output_signature():
  bridged = tb.torch_function(
    lambda x: {"a": x * 2, "b": Pair(first=x.sum(), second=x.to(torch.int32))},
    output_signature={
      "a": tf.TensorSpec([None, 2], tf.float32),
      "b": Pair(first=tf.TensorSpec([], tf.float32), second=tf.TensorSpec([None, 2], tf.int32)),
    },
  )

  @tf.function
  def traced(x):
    out = bridged(x)
    assert out["a"].shape.as_list() == [None, 2]
    assert out["b"].second.shape.as_list() == [None, 2]
    return out

  out = traced(tf.ones([3, 2]))
  assert isinstance(out["b"], Pair)
  assert out["b"].second.dtype == tf.int32
  np.testing.assert_array_equal(out["a"].numpy(), np.full([3, 2], 2.0))
  assert out["b"].first.numpy() == 6.0


@pytest.mark.parametrize(
  "spec,expected",
  [
    (tf.TensorSpec([3], tf.float64), "dtype torch.float32, but float64"),
    (tf.TensorSpec([4], tf.float32), "shape (3,), but (4,)"),
  ],
)
def test_output_signature_mismatch_is_reported(spec, expected):
  bridged = tb.torch_function(lambda x: x * 2, output_signature=spec)
  traced = tf.function(lambda x: bridged(x))
  with pytest.raises(tf.errors.OpError) as info:
    traced(tf.ones([3]))
  assert expected in str(info.value)
  assert "output_signature" in str(info.value)


# --- Errors raised by torch code. ---


class TorchSideError(ValueError):
  pass


def make_failing():
  state = {"fail": True}

  @tb.torch_function
  def failing(a):
    if state["fail"] and not a.is_meta:
      raise TorchSideError("torch refused value 1234")
    return a * 2

  return failing, state


def test_eager_exception_keeps_its_type_and_traceback():
  failing, state = make_failing()
  x = tf.constant([1.0, 2.0])
  with tf.GradientTape() as tape:
    tape.watch(x)
    with pytest.raises(TorchSideError, match="torch refused value 1234") as info:
      failing(x)
  assert any(entry.name == "failing" for entry in info.traceback)
  state["fail"] = False
  np.testing.assert_array_equal(failing(x).numpy(), [2.0, 4.0])


def test_exception_in_tf_function_reaches_caller(float_dtype):
  failing, state = make_failing()
  x = tf.constant([1.0, 2.0], float_dtype)

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.reduce_sum(failing(x))
    return y, tape.gradient(y, x)

  with pytest.raises(tf.errors.OpError) as info:
    step(x)
  message = str(info.value)
  assert "TorchSideError" in message
  assert "torch refused value 1234" in message
  assert "in failing" in message and __file__.split("/")[-1] in message
  assert 'raise TorchSideError("torch refused value 1234")' in message
  # The next call of the same traced function works.
  state["fail"] = False
  y, grad = step(x)
  assert y.numpy() == 6.0
  np.testing.assert_array_equal(grad.numpy(), [2.0, 2.0])


class _FailingBackward(torch.autograd.Function):
  @staticmethod
  def forward(ctx, a):
    return a * 3

  @staticmethod
  def backward(ctx, grad):
    raise TorchSideError("backward refused")


def test_exception_in_backward(mode):
  bridged = tb.torch_function(_FailingBackward.apply, name="fails_backward")
  good = tb.torch_function(lambda a: a * 3)
  x = tf.constant([1.0, 2.0])

  def step(fn, x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.reduce_sum(fn(x))
    return tape.gradient(y, x)

  if mode == "eager":
    with pytest.raises(TorchSideError, match="backward refused"):
      step(bridged, x)
  else:
    with pytest.raises(tf.errors.OpError) as info:
      tf.function(step)(bridged, x)
    assert "TorchSideError" in str(info.value)
    assert "backward refused" in str(info.value)
  np.testing.assert_array_equal(step(good, x).numpy(), [3.0, 3.0])
  np.testing.assert_array_equal(tf.function(step)(good, x).numpy(), [3.0, 3.0])


@pytest.mark.parametrize(
  "make,expected",
  [
    (lambda: tf.constant(["a", "b"]), "dtype string"),
    (lambda: tf.ragged.constant([[1.0], [2.0, 3.0]]), "tf.RaggedTensor"),
    (lambda: tf.sparse.SparseTensor([[0]], [1.0], [2]), "tf.SparseTensor"),
  ],
  ids=["string", "ragged", "sparse"],
)
def test_unsupported_input_kinds_are_rejected(in_mode, make, expected):
  bridged = tb.torch_function(lambda a: a, name="takes_anything")
  value = make()
  with pytest.raises(TypeError) as info:
    in_mode(lambda: bridged(value))()
  assert "takes_anything()" in str(info.value)
  assert expected in str(info.value)


def test_jit_compile_is_refused_with_the_alternative(monkeypatch):
  # Where the XLA custom call (csrc/xla/) cannot be had; tests/test_xla.py
  # runs the same under XLA where it can.
  from torchbridge._native import _xla

  monkeypatch.setattr(_xla, "unavailable", lambda: "no compiler (test)")
  bridged = tb.torch_function(lambda a: a * 2, name="double")
  compiled = tf.function(lambda a: bridged(a), jit_compile=True)
  with pytest.raises(NotImplementedError) as info:
    compiled(tf.ones([2]))
  message = str(info.value)
  assert "double" in message
  assert "XLA" in message and "jit_compile=True" in message
  assert "jit_compile=False" in message
  # Without XLA the same function works.
  np.testing.assert_array_equal(tf.function(lambda a: bridged(a))(tf.ones([2])).numpy(), [2.0, 2.0])


# --- Eager calls pay for no tf.py_function, and keep nothing. ---


def test_eager_calls_do_not_use_py_function(monkeypatch):
  def forbidden(*args, **kwargs):
    raise AssertionError("tf.py_function used in an eager call")

  monkeypatch.setattr(tf, "py_function", forbidden)
  monkeypatch.setattr(tf.compat.v1, "py_func", forbidden)
  monkeypatch.setattr(_op, "call", forbidden)  # the graph-mode native op
  bridged = tb.torch_function(lambda a, b: torch.sin(a) * b)
  a = tf.constant([0.5, 1.5], tf.float64)
  b = tf.constant([2.0, 3.0], tf.float64)
  np.testing.assert_allclose(bridged(a, b).numpy(), np.sin([0.5, 1.5]) * [2, 3])
  results = second_order(bridged, a, b)
  assert_sin_mul_derivatives(a, b, *results, tf.float64)
  # The same monkeypatch does break graph mode: the check above is real.
  with pytest.raises(AssertionError, match="tf.py_function used"):
    tf.function(lambda a, b: bridged(a, b))(a, b)


def test_eager_call_without_tape_builds_no_graph():
  seen = {}

  @tb.torch_function
  def fn(a):
    seen["grad_enabled"] = torch.is_grad_enabled()
    seen["requires_grad"] = a.requires_grad
    return a * 2

  fn(tf.ones([2]))
  assert seen == {"grad_enabled": False, "requires_grad": False}
  with tf.GradientTape() as tape:
    x = tf.ones([2])
    tape.watch(x)
    fn(x)
  assert seen == {"grad_enabled": True, "requires_grad": True}


def test_eager_saved_state_dies_with_the_tape():
  refs = []

  @tb.torch_function
  def fn(a):
    hidden = torch.exp(a)  # saved by autograd for the backward of sin
    refs.append(weakref.ref(hidden))
    return torch.sin(hidden)

  x = tf.constant([0.1, 0.2])
  tape = tf.GradientTape()
  with tape:
    tape.watch(x)
    y = fn(x)
  assert refs[0]() is not None  # kept for a possible backward
  np.testing.assert_allclose(
    tape.gradient(y, x).numpy(), np.cos(np.exp([0.1, 0.2])) * np.exp([0.1, 0.2]), rtol=1e-6
  )
  del tape, y
  gc.collect()
  assert refs[0]() is None


def test_output_dtype_tf_lacks_is_rejected(in_mode):
  bridged = tb.torch_function(lambda a: a.to(torch.float8_e4m3fn), name="to_float8")
  with pytest.raises(TypeError) as info:
    in_mode(lambda a: bridged(a))(tf.ones([2]))
  assert "float8_e4m3fn" in str(info.value)
  assert "x.to(torch.float32)" in str(info.value)


def test_torch_function_as_tf_function_argument():
  # A tf.function traces an argument with `__wrapped__` as the function it
  # wraps; a TorchFunction must stay itself, or torch gets symbolic tensors.
  bridged = tb.torch_function(lambda a: torch.sin(a) * 2)

  @tf.function
  def apply(fn, x):
    return fn(x)

  x = tf.constant([0.5, 1.0])
  np.testing.assert_allclose(apply(bridged, x).numpy(), 2 * np.sin([0.5, 1.0]), rtol=1e-6)
  other = tb.torch_function(lambda a: a + 1)
  np.testing.assert_array_equal(apply(other, x).numpy(), [1.5, 2.0])


def test_in_place_write_into_an_argument_is_reported(in_mode):
  # The torch view of an argument is TF's own buffer: a torch function that
  # writes into it is told so, with the fix, instead of passing silently.
  bump = tb.torch_function(lambda idx: idx.add_(1), name="bump")
  idx = tf.constant([1, 2, 3])
  call = in_mode(lambda i: bump(i))
  with pytest.raises(
    (RuntimeError, tf.errors.UnknownError),
    match=r"bump modified its tensor argument 0 .* in place.*"
    r"x = x \+ 1.*x\.clone\(\)",
  ):
    call(idx)
  # An out-of-place version of the same code works, on the same kind of input.
  plus_one = tb.torch_function(lambda i: i + 1, name="plus_one")
  np.testing.assert_array_equal(
    in_mode(lambda i: plus_one(i))(tf.constant([1, 2, 3])).numpy(), [2, 3, 4]
  )


def test_builtin_torch_function_passed_to_tf_function_directly():
  # torch.sin has no Python signature; tf.function(f) asks for one.
  f = tb.torch_function(torch.sin)
  x = tf.constant([0.5, 1.0], tf.float64)
  traced = tf.function(f)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = traced(x)
  np.testing.assert_array_equal(y.numpy(), np.sin(x.numpy()))
  np.testing.assert_array_equal(tape.gradient(y, x).numpy(), np.cos(x.numpy()))
  assert f.__name__ == "sin"
