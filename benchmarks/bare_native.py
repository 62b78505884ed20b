"""A module's TF side with its torch side taken out: the floor of a bridged step.

`BareNativeModule` stands where a `tb.TorchModule` stood in a TF program:
the same variables (shapes and initial values of the torch parameters),
read and passed to one native op per forward and one per backward, as the
bridge's are. The ops are bare: their callback hands input buffers back as
outputs (no torch, no Python of the bridge), so a step built on them costs
what the TF program around the bridged calls costs (graph dispatch, the
loss, the optimizer, the native ops' own crossing) and nothing else.
"""

import types

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

  def _bare_op(self, count, inputs_tf, dtypes, out_shapes):
    """One bare op: outputs of `dtypes` and `out_shapes` (its first `count`
    inputs handed back, or fresh torch tensors like them)."""
    if self._torch_outputs:
      return _op.call(_fresh_torch(count), inputs_tf, dtypes, out_shapes, torch_tensors=True)
    return _op.call(_hand_back(count), inputs_tf, dtypes, out_shapes)

  # As `tb.TorchModule.__call__`: autograph would otherwise convert this
  # method and the torch code `_outputs_for` runs (seconds, at trace time).
  @tf.autograph.experimental.do_not_convert
  def __call__(self, *inputs_tf):
    shapes, single = self._outputs_for(inputs_tf)
    zeros_tf = [tf.constant(np.zeros(s, np.float32)) for s in shapes]
    n_args = len(inputs_tf) + len(self.params)
    bare_op = self._bare_op

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


class LeanTorchModule(BareNativeModule):
  """The leanest Python bridge on the same native op: the floor with the
  torch compute put back, and nothing of torchbridge's own Python.

  A forward op's callback swaps the op's parameter tensors into the torch
  module's parameter dicts, runs the module (recording autograd when the
  op's handle output is consumed, that is when a tape will ask for the
  backward), swaps the module's own back and hands back the outputs and a
  handle; the backward op's callback runs `torch.autograd.grad` for the
  gradients TF consumes. No argument binding, no output checks, no modes,
  no timeline, no placement: what any bridge that runs a user's
  `nn.Module` from a TF graph must do at the least, in Python.

  For the benchmarks only: one module, fixed input shapes, float32, no
  error handling, and a forward whose backward never runs leaks its record.
  """

  def __init__(self, module_torch, name="lean_bridge"):
    super().__init__(module_torch, name, torch_outputs=True)
    by_id = {id(p): k for k, (_, p) in enumerate(module_torch.named_parameters())}
    # (parameter dict, key, index of the parameter among the op's); held
    # where tf.Module's attribute tracking does not wrap the dicts.
    self._lean = types.SimpleNamespace(records={})  # handle's data_ptr -> (args, outputs)
    self._lean.slots = [
      (sub._parameters, key, by_id[id(p)])  # pylint: disable=protected-access
      for sub in module_torch.modules()
      for key, p in sub._parameters.items()  # pylint: disable=protected-access
      if p is not None
    ]

  @tf.autograph.experimental.do_not_convert
  def __call__(self, *inputs_tf):
    shapes, single = self._outputs_for(inputs_tf)
    n_in, module = len(inputs_tf), self._module_torch
    slots, records = self._lean.slots, self._lean.records

    def forward(args_torch, unused):
      record = unused is None or 0 not in unused
      if record:
        args_torch = [a.detach().requires_grad_() for a in args_torch]
      params = args_torch[n_in:]
      originals = [table[key] for table, key, _ in slots]
      for table, key, k in slots:
        table[key] = params[k]
      grad_mode = torch.is_grad_enabled()
      torch._C._set_grad_enabled(record)  # pylint: disable=protected-access
      try:
        out = module(*args_torch[:n_in])
      finally:
        torch._C._set_grad_enabled(grad_mode)  # pylint: disable=protected-access
        for (table, key, _), original in zip(slots, originals):
          table[key] = original
      outs = [out] if single else list(out)
      if not record:
        return [None, *outs]
      handle = torch.empty(1, dtype=torch.int8)
      records[handle.data_ptr()] = (args_torch, outs)
      return [handle, *[o.detach() for o in outs]]

    def backward(args_torch, unused):
      args, outs = records.pop(args_torch[0].data_ptr())
      wanted = [k for k in range(len(args)) if unused is None or k not in unused]
      grads = torch.autograd.grad(
        outs, [args[k] for k in wanted], args_torch[1:], allow_unused=True
      )
      result = [None] * len(args)
      for k, g in zip(wanted, grads):
        result[k] = torch.zeros_like(args[k]) if g is None else g
      return result

    @tf.custom_gradient
    def call(*args_tf):  # the inputs, then the variables' values
      results = _op.call(
        forward,
        list(args_tf),
        [tf.int8] + [tf.float32] * len(shapes),
        [[1]] + list(shapes),
        torch_tensors=True,
      )
      handle_tf, outs_tf = results[0], results[1:]

      def grad(*dys_tf):
        dys_tf = [tf.zeros(s) if d is None else d for d, s in zip(dys_tf, shapes)]
        return _op.call(
          backward,
          [handle_tf, *dys_tf],
          [a.dtype for a in args_tf],
          [a.shape for a in args_tf],
          torch_tensors=True,
        )

      return outs_tf, grad

    outs_tf = call(*inputs_tf, *[tf.convert_to_tensor(v) for v in self.params])
    return outs_tf[0] if single else tuple(outs_tf)
