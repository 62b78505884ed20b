"""The child process that runs the generated cases of tests/test_properties.py.

The test starts it once per module and feeds it cases over a pipe: a case is
a name and a spec made only of Python literals (strings, numbers, tuples,
lists, dicts, None), and the worker builds the tensors and checks every
property itself, so a crash (a signal, an abort inside TF) takes down this
process only and fails one example. It inherits the test's environment, so
`TORCHBRIDGE_DISABLE_NATIVE=1` picks the `tf.py_function` path here too.

Replay one case (the reproducer a failing example prints):
  python tests/_property_worker.py --replay CASE "SPEC"
"""

import ast
import collections
import copy
import dataclasses
import gc
import os
import sys
import traceback
from multiprocessing.connection import Connection

import numpy as np
import torch  # before tensorflow, as everywhere in torchbridge
import tensorflow as tf

import torchbridge as tb

TF_ALIGNMENT = 64  # docs/guides/tensor-exchange.md: TF needs 64-byte aligned CPU buffers

# name -> (TF dtype, torch dtype): every dtype both frameworks have.
DTYPES = {
  "bool": (tf.bool, torch.bool),
  "int8": (tf.int8, torch.int8),
  "int16": (tf.int16, torch.int16),
  "int32": (tf.int32, torch.int32),
  "int64": (tf.int64, torch.int64),
  "uint8": (tf.uint8, torch.uint8),
  "uint16": (tf.uint16, torch.uint16),
  "uint32": (tf.uint32, torch.uint32),
  "uint64": (tf.uint64, torch.uint64),
  "float16": (tf.float16, torch.float16),
  "bfloat16": (tf.bfloat16, torch.bfloat16),
  "float32": (tf.float32, torch.float32),
  "float64": (tf.float64, torch.float64),
  "complex64": (tf.complex64, torch.complex64),
  "complex128": (tf.complex128, torch.complex128),
}
FLOATS = ("float16", "bfloat16", "float32", "float64")
COMPLEX = ("complex64", "complex128")
# The dtypes torch computes with on CPU (uint16/32/64 have few kernels).
ARITHMETIC = ("int8", "int16", "int32", "int64", "uint8") + FLOATS + COMPLEX

Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Box:
  """A dataclass: not a nest to tf.nest, so a leaf passed through as it is."""

  content: object


# --- Values, bit patterns and memory. ---


def np_dtype(name):
  return DTYPES[name][0].as_numpy_dtype


def itemsize(name):
  return DTYPES[name][1].itemsize


def make_bytes(name, n, seed, fill):
  """`n` elements of dtype `name` as raw bytes (a uint8 numpy array).

  fill: "bits" (any bit pattern: NaNs with payloads, infinities, -0.0,
  subnormals), "normal" (finite values) or "zeros".
  """
  rng = np.random.default_rng(seed)
  if fill == "zeros":
    return np.zeros(n * itemsize(name), np.uint8)
  if name == "bool":
    return (rng.integers(0, 2, n)).astype(np.uint8)
  if fill == "bits":
    return np.frombuffer(rng.bytes(n * itemsize(name)), np.uint8).copy()
  if name in FLOATS:
    values = rng.standard_normal(n).astype(np.float32).astype(np_dtype(name))
  elif name in COMPLEX:
    values = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np_dtype(name))
  else:
    low = 0 if name.startswith("u") else -100
    values = rng.integers(low, 100, n).astype(np_dtype(name))
  return np.frombuffer(values.tobytes(), np.uint8).copy()


def bits_of_torch(x_torch):
  """The bytes of a torch tensor's values, row-major."""
  if not x_torch.numel():
    return b""
  x_torch = x_torch.detach().resolve_conj().resolve_neg()
  # A fresh dense copy (a size-1 dimension may keep any stride otherwise).
  flat = torch.empty(x_torch.numel(), dtype=x_torch.dtype)
  flat.copy_(x_torch.reshape(-1))
  return flat.view(torch.uint8).numpy().tobytes()


def bits_of_tf(x_tf):
  return np.ascontiguousarray(x_tf.numpy()).tobytes()


def tf_owned(name, shape, seed, fill="bits"):
  """A tensor in a buffer TF allocated (the result of a TF op)."""
  n = int(np.prod(shape, dtype=np.int64))
  values = np.frombuffer(make_bytes(name, n, seed, fill).tobytes(), np_dtype(name)).reshape(shape)
  return tf.identity(tf.constant(values, dtype=DTYPES[name][0]))


def torch_owned(name, shape, seed, fill="bits"):
  n = int(np.prod(shape, dtype=np.int64))
  x_torch = torch.empty(n, dtype=DTYPES[name][1])
  if n:
    x_torch.view(torch.uint8).copy_(torch.from_numpy(make_bytes(name, n, seed, fill)))
  return x_torch.reshape(shape)


def dense_row_major(shape, strides):
  """The layout TF can use as it is (size-1 dimensions may have any stride)."""
  if 0 in shape:
    return True
  expected = 1
  for size, stride in reversed(list(zip(shape, strides))):
    if size != 1 and stride != expected:
      return False
    expected *= size
  return True


def torch_view(spec):
  """A strided torch view, and the bytes it should read, computed without
  torch (numpy's as_strided over the same storage bytes).

  spec: dtype, shape, strides (elements), offset (elements), seed, fill,
  conj, neg, requires_grad.
  """
  name, shape, strides = spec["dtype"], tuple(spec["shape"]), spec["strides"]
  offset, size = spec["offset"], itemsize(spec["dtype"])
  extent = sum((n - 1) * s for n, s in zip(shape, strides)) if 0 not in shape else 0
  length = offset + extent + 1
  storage_bytes = make_bytes(name, length, spec["seed"], spec["fill"])
  base = torch.empty(length, dtype=DTYPES[name][1])
  base.view(torch.uint8).copy_(torch.from_numpy(storage_bytes))
  x_torch = base.as_strided(shape, strides, offset)
  cells = storage_bytes.view(f"V{size}")[offset:]
  expected = (
    np.lib.stride_tricks.as_strided(cells, shape, [s * size for s in strides]).copy().tobytes()
  )
  if spec.get("conj"):
    x_torch = x_torch.conj()
  if spec.get("neg"):
    x_torch = torch._neg_view(x_torch)
  if spec.get("conj") or spec.get("neg"):
    # The value is torch's conjugate / negation, not the memory.
    expected = bits_of_torch(x_torch)
  if spec.get("requires_grad"):
    x_torch.requires_grad_()
  return base, x_torch, expected


def flip_first_byte_torch(storage, index):
  """Changes element `index` of a torch storage (bool stays 0 or 1)."""
  with torch.no_grad():
    storage.view(torch.uint8)[index * storage.element_size()] ^= 1


def first_byte(bits):
  return bits[0] if bits else None


def assert_stats(zero_copy=0, copied=0, bytes_copied=0):
  got = tb.exchange_stats()
  want = {"zero_copy": zero_copy, "copied": copied, "bytes_copied": bytes_copied}
  assert got == want, f"exchange_stats() {got}, expected {want}"


def check_tf_kernel_runs(x_tf):
  """A TF kernel reads the buffer (a misaligned one would abort here)."""
  flat = tf.reshape(x_tf, [-1])
  doubled = tf.concat([flat, flat], 0)
  assert bits_of_tf(doubled) == bits_of_tf(flat) * 2
  if x_tf.dtype in (tf.float32, tf.float64, tf.int32, tf.int64, tf.complex64, tf.complex128):
    tf.reduce_sum(x_tf)


# --- to_tf: torch views of every layout. ---


def case_to_tf_view(spec):
  """to_tf of a strided torch view: equal bits; shared exactly when the
  documented rule allows (dense row-major, 64-byte aligned, no lazy
  conjugation or negation), else one counted copy; back to torch again."""
  base, x_torch, expected = torch_view(spec)
  name, shape = spec["dtype"], tuple(spec["shape"])
  numel = int(np.prod(shape, dtype=np.int64))
  start = base.data_ptr() + spec["offset"] * itemsize(name)
  shared = (
    not spec.get("conj")
    and not spec.get("neg")
    and dense_row_major(shape, spec["strides"])
    and (numel == 0 or start % TF_ALIGNMENT == 0)
  )
  tb.reset_exchange_stats()
  x_tf = tb.to_tf(x_torch)
  assert isinstance(x_tf, tf.Tensor)
  assert x_tf.dtype == DTYPES[name][0], x_tf.dtype
  assert tuple(x_tf.shape) == shape, x_tf.shape
  assert bits_of_tf(x_tf) == expected, "to_tf changed the bits"
  if shared:
    assert_stats(zero_copy=1)
  else:
    assert_stats(copied=1, bytes_copied=numel * itemsize(name))
  check_tf_kernel_runs(x_tf)

  tb.reset_exchange_stats()
  back_torch = tb.to_torch(x_tf)
  assert_stats(zero_copy=1)
  assert back_torch.dtype == DTYPES[name][1]
  assert bits_of_torch(back_torch) == expected
  if numel:
    assert back_torch.data_ptr() % TF_ALIGNMENT == 0
    assert (back_torch.data_ptr() == x_torch.data_ptr()) == shared, (
      f"shared memory: {back_torch.data_ptr() == x_torch.data_ptr()}, the rule says {shared}"
    )
    # Memory identity: a write into the torch storage reaches TF iff shared.
    flip_first_byte_torch(base, spec["offset"])
    now = first_byte(bits_of_tf(x_tf))
    assert (now != expected[0]) == shared, (
      f"a write through torch {'did not reach' if shared else 'reached'} the TF tensor"
    )
  return {"shared": shared}


# --- to_torch: TF tensors, variables, numpy arrays. ---


def case_to_torch(spec):
  """to_torch of a TF tensor or variable: always shared (TF buffers are
  dense and aligned), equal bits; a write through torch is read by TF; and
  back through to_tf, shared again."""
  name, shape = spec["dtype"], tuple(spec["shape"])
  x_tf = tf_owned(name, shape, spec["seed"], spec["fill"])
  expected = bits_of_tf(x_tf)
  source = tf.Variable(x_tf) if spec["kind"] == "variable" else x_tf
  tb.reset_exchange_stats()
  x_torch = tb.to_torch(source)
  assert isinstance(x_torch, torch.Tensor)
  assert x_torch.dtype == DTYPES[name][1]
  assert tuple(x_torch.shape) == shape
  assert bits_of_torch(x_torch) == expected
  assert_stats(zero_copy=1)

  tb.reset_exchange_stats()
  back_tf = tb.to_tf(x_torch)
  assert_stats(zero_copy=1)
  assert back_tf.dtype == DTYPES[name][0]
  assert bits_of_tf(back_tf) == expected
  if x_torch.numel():
    flip_first_byte_torch(x_torch.reshape(-1), 0)
    for seen in (source, back_tf):
      assert first_byte(bits_of_tf(tf.convert_to_tensor(seen))) != expected[0], (
        "a write through torch did not reach TF: not shared"
      )
  return {"shared": True}


def numpy_view(spec):
  """A numpy view: byte offset from a 64-byte boundary, steps (negative
  ones too), transposition, read-only flag."""
  name, shape = spec["dtype"], tuple(spec["shape"])
  size = itemsize(name)
  steps = spec["steps"]
  full = [max(abs(st) * n, 1) for n, st in zip(shape, steps)]
  n = int(np.prod(full, dtype=np.int64))
  raw = np.zeros((n + spec["byte_offset"]) * size + TF_ALIGNMENT, np.uint8)
  start = (-raw.ctypes.data) % TF_ALIGNMENT + spec["byte_offset"] * size
  cells = raw[start : start + n * size]
  cells[:] = make_bytes(name, n, spec["seed"], spec["fill"])
  arr = cells.view(np_dtype(name)).reshape(full)
  # (The trailing Ellipsis keeps a 0-d array an array, not a numpy scalar.)
  arr = arr[tuple(slice(None, None, st) for st in steps) + (Ellipsis,)]
  arr = arr[tuple(slice(0, k) for k in shape) + (Ellipsis,)]
  arr = arr.transpose(spec["perm"]) if len(shape) > 1 else arr
  if spec["read_only"]:
    arr.flags.writeable = False
  return raw, start, arr


def case_numpy(spec):
  """numpy arrays: to_torch shares unless read-only or negatively strided;
  to_tf shares when, in addition, the array is dense row-major and
  64-byte aligned; every other case is one counted copy."""
  raw, start, arr = numpy_view(spec)
  expected = np.ascontiguousarray(arr).tobytes()
  name = spec["dtype"]
  nbytes = arr.size * arr.itemsize
  torch_may_share = arr.flags.writeable and all(s >= 0 for s in arr.strides)
  tf_may_share = torch_may_share and (
    arr.size == 0
    or (
      dense_row_major(arr.shape, [s // arr.itemsize for s in arr.strides])
      and arr.ctypes.data % TF_ALIGNMENT == 0
    )
  )
  results = {}
  for convert, shared in ((tb.to_torch, torch_may_share), (tb.to_tf, tf_may_share)):
    tb.reset_exchange_stats()
    out = convert(arr)
    if convert is tb.to_torch:
      assert out.dtype == DTYPES[name][1]
      got = bits_of_torch(out)
    else:
      assert out.dtype == DTYPES[name][0]
      got = bits_of_tf(out)
    assert tuple(out.shape) == arr.shape
    assert got == expected, f"{convert.__name__} changed the bits"
    if shared:
      assert_stats(zero_copy=1)
    else:
      assert_stats(copied=1, bytes_copied=nbytes)
    results[convert.__name__] = out
  if arr.size:
    # Memory identity: change the first element's bytes in the array's memory.
    first = arr.ctypes.data - raw.ctypes.data
    raw[first] ^= 1
    for fn_name, shared in (("to_torch", torch_may_share), ("to_tf", tf_may_share)):
      out = results[fn_name]
      now = bits_of_torch(out) if fn_name == "to_torch" else bits_of_tf(out)
      assert (now[0] != expected[0]) == shared, (
        f"{fn_name}: a write into the array {'did not reach' if shared else 'reached'} the result"
      )
  return {"to_torch_shared": torch_may_share, "to_tf_shared": tf_may_share}


# --- Nests. ---


def build_nest(desc, make_leaf, in_box=False):
  """A nest from its description: ("list"|"tuple"|"point"|"box", [children]),
  ("dict", [(key, child)]), ("tensor", leaf spec), ("none",), ("static", v).
  `make_leaf(leaf spec, in_box)` makes the tensors."""
  kind = desc[0]
  if kind == "tensor":
    return make_leaf(desc[1], in_box)
  if kind == "none":
    return None
  if kind == "static":
    return desc[1]
  if kind == "dict":
    return {key: build_nest(child, make_leaf, in_box) for key, child in desc[1]}
  children = [build_nest(child, make_leaf, in_box or kind == "box") for child in desc[1]]
  if kind == "list":
    return children
  if kind == "tuple":
    return tuple(children)
  if kind == "point":
    return Point(*children)
  return Box(children)  # a dataclass: a leaf, passed through as it is


def compare_nests(got, want, leaf_check, path="structure"):
  """Same containers (exact types), same keys, leaves checked by `leaf_check`."""
  if isinstance(want, Box):
    assert got is want, f"{path}: a dataclass leaf was not passed through"
    return
  if isinstance(want, (list, tuple, dict)):
    assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
    if isinstance(want, dict):
      assert list(got) == list(want), f"{path}: keys {list(got)}"
      items = [(k, got[k], want[k]) for k in want]
    else:
      assert len(got) == len(want), f"{path}: length {len(got)}"
      items = [(k, g, w) for k, (g, w) in enumerate(zip(got, want))]
    for k, g, w in items:
      compare_nests(g, w, leaf_check, f"{path}[{k!r}]")
    return
  leaf_check(got, want, path)


def case_nest(spec):
  """to_torch then to_tf of a nest mixing TF tensors, variables, torch
  tensors, None, static values and dataclasses: containers kept exactly,
  TF leaves cross to torch (torch leaves pass through) and back, the count
  is one zero-copy crossing per converted tensor each way."""
  leaves = []  # the tensors outside dataclasses (those are leaves themselves)

  def make_leaf(leaf, in_box):
    if leaf["kind"] == "torch":
      made = torch_owned(leaf["dtype"], leaf["shape"], leaf["seed"])
    else:
      made = tf_owned(leaf["dtype"], leaf["shape"], leaf["seed"])
      if leaf["kind"] == "variable":
        made = tf.Variable(made)
    if not in_box:
      leaves.append(made)
    return made

  nest = build_nest(spec["nest"], make_leaf)
  n_tf = sum(not isinstance(x, torch.Tensor) for x in leaves)
  n_torch = len(leaves) - n_tf

  def torch_side(got, want, path):
    if isinstance(want, torch.Tensor):
      assert got is want, f"{path}: a torch tensor was not passed through"
    elif isinstance(want, (tf.Tensor, tf.Variable)):
      assert isinstance(got, torch.Tensor), f"{path}: {type(got)}"
      assert bits_of_torch(got) == bits_of_tf(tf.convert_to_tensor(want)), path
    else:
      assert got is want, f"{path}: static leaf {want!r} became {got!r}"

  tb.reset_exchange_stats()
  nest_torch = tb.to_torch(nest)
  assert_stats(zero_copy=n_tf)
  compare_nests(nest_torch, nest, torch_side)

  def tf_side(got, want, path):
    if isinstance(want, torch.Tensor):
      assert isinstance(got, tf.Tensor), f"{path}: {type(got)}"
      assert bits_of_tf(got) == bits_of_torch(want), path
    else:
      assert got is want, f"{path}: {want!r} became {got!r}"

  tb.reset_exchange_stats()
  nest_tf = tb.to_tf(nest_torch)
  assert_stats(zero_copy=len(leaves))
  compare_nests(nest_tf, nest_torch, tf_side)
  return {"tf_leaves": n_tf, "torch_leaves": n_torch}


# --- torch_function: forward bits and gradients. ---


def _ops():
  """name -> (torch function of a list of tensors, dtypes it takes,
  smallest rank, differentiable)."""
  every = tuple(DTYPES)
  return {
    "identity": (lambda xs: xs[0], every, 0, True),
    "clone": (lambda xs: xs[0].clone(), every, 0, True),
    "transpose": (lambda xs: xs[0].transpose(0, -1), every, 1, True),
    "step_slice": (lambda xs: xs[0][..., ::2], every, 1, True),
    "misaligned": (lambda xs: xs[0].reshape(-1)[1:], every, 0, True),
    "sin": (lambda xs: torch.sin(xs[0]), FLOATS + COMPLEX, 0, True),
    "poly": (lambda xs: xs[0] * xs[0] + xs[0], ARITHMETIC, 0, True),
    "sum_last": (lambda xs: xs[0].sum(-1), ARITHMETIC + ("bool",), 1, True),
    "product": (lambda xs: xs[0] * xs[1], ARITHMETIC, 0, True),
    "scale_by_int": (lambda xs: xs[0] * xs[1].to(xs[0].dtype), FLOATS, 0, True),
    "nest": (
      lambda xs: {
        "y": torch.sin(xs[0]) if xs[0].is_floating_point() else xs[0].clone(),
        "rest": (Point(xs[0].transpose(0, -1) if xs[0].dim() else xs[0], None), [3, 2.5, True]),
      },
      every,
      0,
      True,
    ),
  }


OPS = _ops()


def op_inputs(spec):
  """The op's arguments: the generated tensor, a second one of the same
  shape (the same dtype, or int32 for scale_by_int)."""
  name, shape = spec["dtype"], tuple(spec["shape"])
  fill = spec["fill"]
  xs = [(name, fill)]
  if spec["op"] == "product":
    xs.append((name, fill))
  elif spec["op"] == "scale_by_int":
    xs.append(("int32", "normal"))
  return [tf_owned(n, shape, spec["seed"] + k, f) for k, (n, f) in enumerate(xs)]


def _flat_tensors(result):
  return [x for x in tf.nest.flatten(result) if x is not None]


def _torch_reference(fn, args_tf, dys, grad):
  """The op in torch alone, on independent copies of the arguments."""
  args_torch = [
    torch.from_numpy(np.array(a.numpy()))
    if a.dtype != tf.bfloat16
    else torch.from_numpy(np.array(a.numpy()).view(np.int16)).view(torch.bfloat16)
    for a in args_tf
  ]
  leaves = [a.is_floating_point() and grad for a in args_torch]
  for a, leaf in zip(args_torch, leaves):
    a.requires_grad_(leaf)
  result = fn(args_torch)
  flat = [torch.as_tensor(x) for x in tf.nest.flatten(result) if x is not None]
  grads = None
  if grad:
    pairs = [(y, dy) for y, dy in zip(flat, dys) if dy is not None and y.requires_grad]
    wrt = [a for a, leaf in zip(args_torch, leaves) if leaf]
    if not pairs:  # no output depends on a floating argument
      return flat, [None] * len(args_torch)
    got = torch.autograd.grad(
      [y for y, _ in pairs],
      wrt,
      [
        torch.from_numpy(np.array(dy.numpy()).view(np.int16)).view(torch.bfloat16)
        if dy.dtype == tf.bfloat16
        else torch.from_numpy(np.array(dy.numpy()))
        for _, dy in pairs
      ],
      allow_unused=True,
    )
    got = iter(got)
    grads = [next(got) if leaf else None for leaf in leaves]
  return flat, grads


def upstream(outs, seed):
  """An upstream gradient for each floating output (None for the others)."""
  dys = []
  for k, y in enumerate(outs):
    if y.dtype.is_floating:
      dys.append(tf_owned(y.dtype.name, tuple(y.shape), seed + 100 + k, "normal"))
    else:
      dys.append(None)
  return dys


def _grad_tolerance(dtype):
  return {tf.float16: 2e-2, tf.bfloat16: 5e-2, tf.float32: 1e-5, tf.float64: 1e-12}[dtype]


def case_torch_function(spec):
  """A torch_function call, eagerly, in tf.function, or in tf.function with
  None dimensions: outputs bit-equal to torch alone; with `grad`, gradients
  equal to torch autograd (None for integer and complex arguments)."""
  fn, _, _, _ = OPS[spec["op"]]
  args_tf = op_inputs(spec)
  grad = spec["grad"]
  mode = spec["mode"]
  bridged = tb.torch_function(lambda *xs: fn(list(xs)), name="prop_fn")
  # Outputs alone first (their dtypes and shapes), eagerly.
  probe = _flat_tensors(bridged(*args_tf))
  dys = upstream(probe, spec["seed"]) if grad else [None] * len(probe)
  dys_used = [dy for dy in dys if dy is not None]
  static = {}

  def run(*args):
    with tf.GradientTape(persistent=True) as tape:
      for a in args:
        tape.watch(a)
      result = bridged(*args)
    outs = _flat_tensors(result)
    static["shapes"] = [y.shape for y in outs]
    grads = [None] * len(args)
    if dys_used:
      grads = tape.gradient(
        [y for y, dy in zip(outs, dys) if dy is not None], list(args), output_gradients=dys_used
      )
    return outs, grads

  if mode == "eager":
    outs_tf, grads_tf = run(*args_tf)
  else:
    dims = spec.get("none_dims", ())
    signature = (
      [
        tf.TensorSpec([None if k in dims else n for k, n in enumerate(a.shape)], a.dtype)
        for a in args_tf
      ]
      if mode == "function_none"
      else None
    )
    outs_tf, grads_tf = tf.function(run, input_signature=signature)(*args_tf)
    for y, static_shape in zip(outs_tf, static["shapes"]):
      assert static_shape.is_compatible_with(y.shape), (static_shape, y.shape)
      if mode == "function":
        # Static input shapes: the output shape is known while tracing.
        assert static_shape.is_fully_defined(), static_shape

  ref_flat, ref_grads = _torch_reference(fn, args_tf, dys, bool(dys_used))
  assert len(outs_tf) == len(ref_flat)
  for y_tf, y_ref in zip(outs_tf, ref_flat):
    assert y_tf.dtype == DTYPES[str(y_ref.dtype).replace("torch.", "")][0]
    assert tuple(y_tf.shape) == tuple(y_ref.shape), (y_tf.shape, y_ref.shape)
    assert bits_of_tf(y_tf) == bits_of_torch(y_ref), "forward bits differ"
  if dys_used:
    for k, (g_tf, g_ref, a) in enumerate(zip(grads_tf, ref_grads, args_tf)):
      if not a.dtype.is_floating or g_ref is None:
        # Integer and complex arguments get no gradient (None, or zeros
        # from a graph); nor do those no output depends on.
        assert g_tf is None or not np.any(g_tf.numpy()), (k, g_tf)
        continue
      assert g_tf is not None, f"no gradient for argument {k}"
      want = g_ref.float().numpy() if g_ref.dtype == torch.bfloat16 else g_ref.numpy()
      got = tf.cast(g_tf, tf.float32).numpy() if g_tf.dtype == tf.bfloat16 else g_tf.numpy()
      tol = _grad_tolerance(a.dtype)
      np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"gradient of argument {k}")
  return {"outputs": len(outs_tf), "grads": bool(dys_used)}


def _adoptable(x_torch):
  """The documented rule: TF uses a torch result's memory as it is."""
  return (
    not x_torch.is_conj()
    and not x_torch.is_neg()
    and x_torch.is_contiguous()
    and (x_torch.numel() == 0 or x_torch.data_ptr() % TF_ALIGNMENT == 0)
  )


def case_function_stats(spec):
  """A torch_function call (no gradient) counts each argument and each
  result once: zero-copy, or (results TF cannot view: transposed, stepped,
  misaligned) one copy with its bytes."""
  fn, _, _, _ = OPS[spec["op"]]
  args_tf = op_inputs(spec)
  results = []

  def recording(*xs):
    result = fn(list(xs))
    flat = [torch.as_tensor(x) for x in tf.nest.flatten(result) if x is not None]
    results[:] = [(_adoptable(x), x.numel() * x.element_size()) for x in flat]
    return result

  bridged = tb.torch_function(recording, name="prop_fn")
  call = bridged
  if spec["mode"] == "function":
    call = tf.function(lambda *xs: bridged(*xs))
    call.get_concrete_function(*args_tf)  # tracing crosses nothing real
  tb.reset_exchange_stats()
  call(*args_tf)
  copies = [nbytes for adoptable, nbytes in results if not adoptable]
  stats = tb.exchange_stats()
  assert (stats["copied"], stats["bytes_copied"]) == (len(copies), sum(copies)), (stats, copies)
  if spec.get("count_zero_copy", True):
    assert stats["zero_copy"] == len(args_tf) + len(results) - len(copies), (
      stats,
      len(args_tf),
      len(results),
    )
  return {"copied": len(copies)}


def case_subnormals(spec):
  """Subnormal values survive torch code inside tf.function as they do in
  torch alone and eagerly (TF's threads flush denormals to zero)."""
  tf_dtype, torch_dtype = DTYPES[spec["dtype"]]
  tiny = float(np.finfo(np_dtype(spec["dtype"])).smallest_subnormal)
  x_tf = tf.identity(tf.constant([tiny * 5, 2.0], tf_dtype))
  bridged = tb.torch_function(lambda a: a * 3, name="prop_fn")
  want = bits_of_torch(torch.tensor([tiny * 5, 2.0], dtype=torch_dtype) * 3)
  assert bits_of_tf(bridged(x_tf)) == want, "eagerly"
  got = tf.function(lambda a: bridged(a))(x_tf)
  assert bits_of_tf(got) == want, f"inside tf.function: {got.numpy()}"
  return {}


# --- TorchModule. ---


def _module(spec):
  torch.manual_seed(spec["seed"])
  width, out = spec["width"], spec["out"]
  kind = spec["module"]
  if kind == "linear":
    return torch.nn.Linear(width, out, bias=spec["bias"])
  if kind == "mlp":
    return torch.nn.Sequential(torch.nn.Linear(width, 5), torch.nn.Tanh(), torch.nn.Linear(5, out))
  if kind == "batchnorm":
    return torch.nn.Sequential(torch.nn.Linear(width, out), torch.nn.BatchNorm1d(out))
  if kind == "layernorm":
    return torch.nn.LayerNorm(width)
  if kind == "embedding":
    return torch.nn.Embedding(7, out)
  raise ValueError(kind)


def case_torch_module(spec):
  """TorchModule on small modules: outputs bit-equal to the same torch
  module called alone, gradients of the input and every parameter equal to
  torch autograd, buffers written back as torch writes them; twice, to see
  the second call (and the written buffers) too."""
  dtype = DTYPES[spec["dtype"]]
  module = _module(spec).to(dtype[1])
  reference = copy.deepcopy(module)
  # The bridge, bit-equal to torch (the default runner's translation is
  # checked within tolerances: tests/test_module_run.py).
  actor = tb.TorchModule(module, name="prop", run="torch")
  training = spec["training"]
  if spec["module"] == "embedding":
    x_np = np.random.default_rng(spec["seed"]).integers(0, 7, spec["batch"])
    x_tf = tf.constant(x_np, tf.int64)
  else:
    shape = tuple(spec["batch"]) + (spec["width"],)
    x_tf = tf_owned(spec["dtype"], shape, spec["seed"], "normal")
  variables = actor.trainable_variables

  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = actor(x, training=training)
      loss = tf.reduce_sum(y * y)
    return y, tape.gradient(loss, [x] + list(variables))

  if spec["mode"] == "eager":
    run = step
  else:
    signature = None
    if spec["mode"] == "function_none":
      signature = [tf.TensorSpec([None] + list(x_tf.shape[1:]), x_tf.dtype)]
    run = tf.function(step, input_signature=signature)

  names = [v.name.split("/", 1)[1].rsplit(":", 1)[0] for v in variables]
  ref_params = dict(reference.named_parameters())
  for call in range(2):
    y_tf, grads_tf = run(x_tf)
    if training is not None:
      reference.train(training)
    x_ref = torch.from_numpy(np.array(x_tf.numpy()))
    x_ref.requires_grad_(x_ref.is_floating_point())
    y_ref = reference(x_ref)
    assert bits_of_tf(y_tf) == bits_of_torch(y_ref), f"call {call}: forward bits"
    wrt = ([x_ref] if x_ref.requires_grad else []) + [ref_params[n] for n in names]
    ref_grads = torch.autograd.grad((y_ref * y_ref).sum(), wrt)
    if not x_ref.requires_grad:
      assert grads_tf[0] is None, "an integer input got a gradient"
      ref_grads = (None,) + tuple(ref_grads)
    tol = 1e-12 if spec["dtype"] == "float64" else 1e-4
    for k, (g_tf, g_ref) in enumerate(zip(grads_tf, ref_grads)):
      if g_ref is None:
        continue
      np.testing.assert_allclose(
        g_tf.numpy(), g_ref.numpy(), rtol=tol, atol=tol, err_msg=f"call {call}: gradient {k}"
      )
    weights = actor.get_weights()
    for name, value in reference.state_dict().items():
      got = np.ascontiguousarray(weights[name]).tobytes()
      assert got == bits_of_torch(value), f"call {call}: {name} differs"
  return {"module": spec["module"]}


# --- Refusals: the documented error type, naming the argument. ---


def _bad_tf_leaf(kind):
  if kind == "string":
    return tf.constant(["a", "bc"])
  if kind == "ragged":
    return tf.ragged.constant([[1.0, 2.0], [3.0]])
  if kind == "sparse":
    return tf.sparse.SparseTensor([[0, 1]], [1.0], [2, 3])
  if kind == "numpy_str":
    return np.array(["a", "b"])
  raise ValueError(kind)


_TF_KIND_TEXT = {
  "string": "dtype string",
  "ragged": "tf.RaggedTensor",
  "sparse": "tf.SparseTensor",
  "numpy_str": "numpy array",
}


def _bad_torch_leaf(kind):
  if kind == "sparse":
    return torch.eye(3).to_sparse()
  if kind == "meta":
    return torch.empty(2, 3, device="meta")
  if kind == "quantized":
    return torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
  if kind == "float8":
    return torch.zeros(3).to(torch.float8_e4m3fn)
  raise ValueError(kind)


_TORCH_KIND_TEXT = {
  "sparse": "sparse torch tensor",
  "meta": "meta torch tensor",
  "quantized": "quantized torch tensor",
  "float8": "float8_e4m3fn",
}


def nest_with_bad_leaf(desc, bad):
  """The nest of `desc` with `bad` at the first tensor leaf; other tensor
  leaves are fine TF (or torch) tensors. Returns the nest and the path."""
  placed = []

  def make_leaf(leaf, in_box):
    del in_box  # refusal nests hold no dataclasses
    if not placed:
      placed.append(True)
      return bad
    return tf_owned("float32", (2,), 0) if leaf["kind"] != "torch" else torch.ones(2)

  return build_nest(desc, make_leaf)


def case_refusal(spec):
  """Kinds that cannot cross, anywhere in a nest: the documented TypeError
  naming the function and the kind; the process and the bridge intact."""
  side, kind = spec["side"], spec["kind"]
  if side == "to_torch":
    nest = nest_with_bad_leaf(spec["nest"], _bad_tf_leaf(kind))
    call, text = tb.to_torch, _TF_KIND_TEXT[kind]
  elif side == "to_tf":
    nest = nest_with_bad_leaf(spec["nest"], _bad_torch_leaf(kind))
    call, text = tb.to_tf, _TORCH_KIND_TEXT[kind]
  else:  # torch_function, eagerly or while tracing
    nest = nest_with_bad_leaf(spec["nest"], _bad_tf_leaf(kind))
    bridged = tb.torch_function(lambda structure: 0, name="prop_fn")
    # A numpy array argument is converted to a TF tensor first.
    call, text = bridged, _TF_KIND_TEXT["string" if kind == "numpy_str" else kind]
    if spec.get("traced") and kind != "numpy_str":
      call = tf.function(bridged)
  try:
    call(nest)
  except TypeError as err:
    message = str(err)
  else:
    raise AssertionError(f"{side} accepted a {kind} leaf")
  who = "prop_fn()" if side == "torch_function" else f"{side}()"
  assert who in message, message
  assert text in message, message
  # The bridge still works.
  assert tb.to_torch(tf.ones([2])).tolist() == [1.0, 1.0]
  return {"message": message}


def case_refusal_names_argument(spec):
  """The refusal names which argument (its path in the nest) is refused."""
  path = spec["path"]
  nest = {"ok": tf.ones([2]), "obs": [tf.ones([1]), tf.constant(["s"])]}
  if spec["side"] == "to_torch":
    call = tb.to_torch
  else:
    call = tb.torch_function(lambda structure: 0, name="prop_fn")
  try:
    call(nest)
  except TypeError as err:
    message = str(err)
  else:
    raise AssertionError("accepted a string leaf")
  assert path in message, f"{path!r} not in {message!r}"
  return {}


def case_symbolic(spec):
  """to_torch of a symbolic tensor while tracing: TypeError that names
  to_torch() and the fix (torch_function / TorchModule)."""
  seen = []

  @tf.function
  def traced(x):
    try:
      tb.to_torch({"a": [x]} if spec["nested"] else x)
    except TypeError as err:
      seen.append(str(err))
    return x

  traced(tf_owned(spec["dtype"], tuple(spec["shape"]), 0))
  assert (
    len(seen) == 1
    and "to_torch()" in seen[0]
    and "symbolic tensor" in seen[0]
    and "tb.torch_function" in seen[0]
  ), seen
  return {}


def case_crash(spec):
  """Only for the test that proves a crash fails one example (not the run)."""
  if spec["how"] == "abort":
    os.abort()
  os.kill(os.getpid(), 9)


CASES = {name[len("case_") :]: fn for name, fn in globals().items() if name.startswith("case_")}


def serve(fd_in, fd_out):
  requests = Connection(fd_in, writable=False)
  replies = Connection(fd_out, readable=False)
  replies.send(("ready", os.environ.get("TORCHBRIDGE_DISABLE_NATIVE")))
  while True:
    try:
      case, spec = requests.recv()
    except EOFError:
      return
    # No cyclic collection inside a case: a wrapper an earlier case left in
    # a reference cycle would copy its torch module's values back mid-case,
    # a counted crossing in this case's exact exchange counts. Collections
    # run between cases.
    gc.disable()
    try:
      replies.send(("ok", CASES[case](spec)))
    except BaseException:  # noqa: B036  (every failure goes back to the test)
      replies.send(("fail", traceback.format_exc()))
    finally:
      gc.enable()


def replay(case, spec_text):
  result = CASES[case](ast.literal_eval(spec_text))
  print("passed:", result)


if __name__ == "__main__":
  if sys.argv[1] == "--replay":
    replay(sys.argv[2], sys.argv[3])
  else:
    serve(int(sys.argv[1]), int(sys.argv[2]))
