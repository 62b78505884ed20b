"""A module's TF side with its torch side taken out: the floor of a bridged step.

`BareNativeModule` stands where a `tb.TorchModule` stood in a TF program:
the same variables (shapes and initial values of the torch parameters),
read and passed to one native op per forward and one per backward, as the
bridge's are. The ops are bare: their callback hands input buffers back as
outputs (no torch, no Python of the bridge), so a step built on them costs
what the TF program around the bridged calls costs (graph dispatch, the
loss, the optimizer, the native ops' own crossing) and nothing else.
"""

import numpy as np
import tensorflow as tf
import torch

from torchbridge._native import _op
from torchbridge._runtime import _omp_team


def _hand_back(count):
  """A native-op callback returning its first `count` input capsules."""
  return lambda capsules: capsules[:count]


def _fresh_torch(count):
  """A `torch_tensors` native-op callback returning fresh torch tensors
  shaped as its first `count` inputs (allocated by torch, not computed)."""
  return lambda args_torch, unused: [torch.empty_like(a) for a in args_torch[:count]]


class BareNativeModule(tf.Module):
  """Variables of `module_torch`; calls are bare native ops, no torch.

  The outputs have the shapes (and nesting: a tensor or a tuple of tensors)
  the torch module gives for the same input shapes, and hold zeros; the
  gradients have the shapes of the inputs and variables.

  With `torch_outputs`, each op takes its inputs as torch tensors and hands
  back fresh torch tensors (uninitialized) instead of its input buffers, as
  a zero-copy bridge's op must: TF then adopts torch's memory and frees it
  through torch, and the op's C++ makes and takes the torch tensors. The
  step built on those is the floor of any zero-copy bridge to torch code.
  """

  def __init__(self, module_torch, name="bare_native", torch_outputs=False):
    super().__init__(name=name)
    self._module_torch = module_torch
    self._torch_outputs = torch_outputs
    with self.name_scope:
      self.params = [
        tf.Variable(p.detach().numpy(), name=n.replace(".", "_"))
        for n, p in module_torch.named_parameters()
      ]
    self._out_shapes = {}

  @property
  def trainable_variables(self):
    return list(self.params)

  @property
  def variables(self):
    return list(self.params)

  def _outputs_for(self, inputs_tf):
    """Shapes of the torch outputs for these input shapes (one torch run,
    at trace time), and whether the output is a tuple."""
    key = tuple(tuple(x.shape) for x in inputs_tf)
    if key not in self._out_shapes:
      with torch.no_grad():
        out_torch = self._module_torch(*[torch.zeros(s) for s in key])
      single = isinstance(out_torch, torch.Tensor)
      outs = [out_torch] if single else list(out_torch)
      self._out_shapes[key] = ([tuple(o.shape) for o in outs], single)
      # That run made this thread's OpenMP team again: released, as tracing
      # a bridged call releases it, so that a floor traced in the process
      # of a bridged step leaves that step's torch code one team.
      _omp_team.release_user_team()
    return self._out_shapes[key]

  def __call__(self, *inputs_tf):
    shapes, single = self._outputs_for(inputs_tf)
    zeros_tf = [tf.constant(np.zeros(s, np.float32)) for s in shapes]
    n_args = len(inputs_tf) + len(self.params)

    def bare_op(count, inputs_tf, dtypes, out_shapes):
      if self._torch_outputs:
        return _op.call(_fresh_torch(count), inputs_tf, dtypes, out_shapes, torch_tensors=True)
      return _op.call(_hand_back(count), inputs_tf, dtypes, out_shapes)

    @tf.custom_gradient
    def call(*args_tf):  # the inputs, then the variables' values
      outs_tf = bare_op(len(shapes), zeros_tf + list(args_tf), [tf.float32] * len(shapes), shapes)

      def grad(*dys_tf):
        return bare_op(
          n_args,
          list(args_tf) + list(dys_tf),
          [a.dtype for a in args_tf],
          [a.shape for a in args_tf],
        )

      return outs_tf, grad

    outs_tf = call(*inputs_tf, *[tf.convert_to_tensor(v) for v in self.params])
    return outs_tf[0] if single else tuple(outs_tf)
