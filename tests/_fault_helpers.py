"""Shared by the fault-injection and concurrency tests: running work under a
timeout on other threads, and comparing state bit for bit.

torch is imported before tensorflow, the recommended order (docs/troubleshooting.md,
"Does the import order matter?").
"""

import threading

import numpy as np
import torch
import tensorflow as tf

# Long enough for a first trace on a loaded 2-core machine; a deadlock waits
# this long and then fails the test.
TIMEOUT_SECONDS = 120


def run_threads(targets, timeout=TIMEOUT_SECONDS):
  """Runs each callable on a thread of its own, started together.

  Fails if any thread is still alive after `timeout` seconds (a deadlock);
  re-raises here the first exception a thread raised (a bare Thread would
  only print it).

  Returns:
    The callables' results, in order.
  """
  results = [None] * len(targets)
  errors = []
  barrier = threading.Barrier(len(targets))
  # torch's intra-op thread count is per thread under OpenMP: the threads
  # take this one's, so that their sums add up in the same order (a test
  # earlier in the process may have changed it here).
  torch_threads = torch.get_num_threads()

  def guarded(k):
    try:
      torch.set_num_threads(torch_threads)
      barrier.wait()
      results[k] = targets[k]()
    except BaseException as err:  # pylint: disable=broad-except
      errors.append(err)

  threads = [
    threading.Thread(target=guarded, args=(k,), daemon=True, name=f"fault-test-{k}")
    for k in range(len(targets))
  ]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout)
  alive = [t.name for t in threads if t.is_alive()]
  assert not alive, (
    f"threads {alive} still running after {timeout} s: a deadlock, or a lock a failed call kept"
  )
  if errors:
    raise errors[0]
  return results


def run_in_thread(fn, timeout=TIMEOUT_SECONDS):
  """`fn()` on another thread, which fails the test if it does not finish
  in time. On another thread, so that a re-entrant lock a failed call kept
  on this one is found too."""
  return run_threads([fn], timeout=timeout)[0]


def bits(array):
  """The value as bytes, dtype and shape: equal exactly when the values are
  equal bit for bit (NaNs and signed zeros included)."""
  array = np.asarray(array)
  return (array.dtype.str, array.shape, array.tobytes())


def assert_bitwise_equal(got, want, what=""):
  """Two `{name: array}` dicts hold the same names and the same bits."""
  assert sorted(got) == sorted(want), what
  differ = [n for n in want if bits(got[n]) != bits(want[n])]
  assert not differ, f"{what}: differ in {differ}"


def variable_values(variables):
  """`{"position:name": copy of its value}` of TF (or Keras) variables;
  the name without its owner's (`adam_1/m` -> `m`), which differs between
  two otherwise equal models."""
  values = {}
  for k, v in enumerate(variables):
    name = (getattr(v, "path", None) or v.name).split("/", 1)[-1]
    values[f"{k}:{name}"] = np.array(v.numpy(), copy=True)
  return values


def optimizer_values(optimizer):
  """Every variable of a Keras optimizer: iterations, learning rate, slots."""
  return variable_values(optimizer.variables)


def assert_torch_module_is_real(module, weights, originals):
  """The torch module holds its own tensors with the values in `weights`
  (`{state_dict name: np.ndarray}`, e.g. `get_weights()`), not what a
  bridged call swaps in or leaves between calls.

  Args:
    module: the wrapped torch module.
    weights: the values the variables hold.
    originals: `{name: tensor}` of `named_parameters()` and
      `named_buffers()` before wrapping: the very objects must still sit in
      the module.
  """
  # First through torch alone (its state_dict hook lends the views), then
  # the parameters themselves.
  state = {n: t.detach().numpy().copy() for n, t in module.state_dict().items()}
  assert_bitwise_equal(state, weights, "state_dict() against the variables")
  current = dict(module.named_parameters())
  current.update(module.named_buffers())
  assert sorted(current) == sorted(originals)
  for name, tensor in current.items():
    assert tensor is originals[name], f"{name} is not the module's own tensor"
    wanted = torch.nn.Parameter if name in dict(module.named_parameters()) else torch.Tensor
    assert type(tensor) is wanted, (name, type(tensor))
    assert 0 not in tensor.stride() or tensor.numel() <= 1, (
      f"{name} is a broadcast placeholder (strides {tensor.stride()})"
    )
    assert bits(tensor.detach().numpy()) == bits(weights[name]), name


def fresh_values(shape, seed, dtype=np.float64):
  """Deterministic standard-normal values as a TF-owned tensor."""
  values = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
  return tf.identity(tf.constant(values))
