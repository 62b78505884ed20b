"""The baseline: a torch model bridged into TF by copying through numpy.

A faithful minimal reproduction of how earlier bridges work:
- tfpyth (`tfpyth.tensorflow_from_torch`, BlackHC/tfpyth) wraps the torch
  function in `tf.py_function`; every input becomes a new torch tensor with
  `torch.tensor(x.numpy())` and every output goes back with
  `.detach().numpy()`; its gradient is a second `tf.py_function` that
  rebuilds the torch inputs from numpy, runs the forward again to get an
  autograd graph, and returns the gradients as numpy arrays.
- cleverhans (`cleverhans.utils_pytorch.convert_pytorch_model_to_tf`) does
  the same with `tf.py_func` for the forward (`torch.from_numpy(x)` in,
  `.numpy()` out) and a backward that re-runs the forward.
Neither can train the torch parameters from TF; to let the same training
step run, the parameters here are TF variables passed through the same
numpy copies as the inputs (what a user of those bridges would have to add).
"""

import numpy as np
import tensorflow as tf
import torch
from torch.func import functional_call


class NumpyBridgeModule(tf.Module):
  """A torch module called from TF by numpy copies (the earlier bridges)."""

  def __init__(self, module, name="numpy_bridge"):
    super().__init__(name=name)
    self._module = module
    self._names = [n for n, _ in module.named_parameters()]
    with self.name_scope:
      self.params = [
        tf.Variable(p.detach().numpy().copy(), name=n.replace(".", "_"))
        for n, p in module.named_parameters()
      ]

  def __call__(self, x_tf):
    out_dtype = self.params[0].dtype

    def to_torch(values, requires_grad):
      # tfpyth: th.tensor(x.numpy()) - a fresh copy for every tensor.
      return [torch.tensor(v.numpy(), requires_grad=requires_grad) for v in values]

    def forward_torch(tensors):
      params = dict(zip(self._names, tensors[:-1]))
      return functional_call(self._module, params, (tensors[-1],))

    @tf.custom_gradient
    def bridged(x, *params):
      def fwd(*values):
        with torch.no_grad():
          return forward_torch(to_torch(values, False)).numpy()

      y = tf.py_function(fwd, list(params) + [x], Tout=out_dtype)

      def grad(dy):
        def bwd(dy_value, *values):
          tensors = to_torch(values, True)
          out = forward_torch(tensors)  # the forward runs again
          grads = torch.autograd.grad(out, tensors, torch.tensor(dy_value.numpy()))
          return [g.numpy() for g in grads]

        grads = tf.py_function(
          bwd, [dy] + list(params) + [x], Tout=[v.dtype for v in params] + [x.dtype]
        )
        return [grads[-1]] + grads[:-1]

      return y, grad

    return bridged(x_tf, *[tf.convert_to_tensor(p) for p in self.params])

  @property
  def trainable_variables(self):
    return list(self.params)


def exchange_round_trip(x_tf):
  """TF -> torch -> TF through numpy, as those bridges move every tensor."""
  x_torch = torch.tensor(x_tf.numpy())
  return tf.convert_to_tensor(x_torch.numpy())


def bytes_copied_by_round_trip(x_tf):
  """Bytes the numpy round trip copies, found by comparing buffers."""
  copied = 0
  x_np = x_tf.numpy()
  x_torch = torch.tensor(x_np)
  if x_torch.data_ptr() != x_np.__array_interface__["data"][0]:
    copied += x_np.nbytes
  y_np = x_torch.numpy()
  y_tf = tf.convert_to_tensor(y_np)
  if not np.shares_memory(y_tf.numpy(), y_np):
    copied += y_np.nbytes
  return copied
