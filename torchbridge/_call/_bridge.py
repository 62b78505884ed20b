"""The differentiable call from TF into torch, to any order of derivative.

General strategy:
1. A bridged call runs a torch computation on zero-copy views of its TF
   arguments. Its floating arguments become torch leaves that require grad,
   so torch records the autograd graph while computing the outputs.
2. The outputs go back to TF zero-copy. The torch outputs, leaves and graph
   are kept in a `_saved.Saved` record for the backward, which never re-runs
   the forward: it computes a vector-Jacobian product on the saved graph
   (`_saved.backward`).
3. The backward is itself a bridged call (its arguments: the upstream
   gradients and the forward's floating arguments; its torch leaves: fresh
   leaves for the upstream gradients and the forward's own leaves), so nested
   `GradientTape`s compose to any order.
4. Eagerly, the `_saved.Saved` record lives in the closure of the gradient
   function that `tf.custom_gradient` hands to the tape, and dies with the tape. When no
   tape is recording, no graph is built at all.
5. Inside `tf.function`, the call is one stateful op (the native
   `TorchbridgeCall` op of csrc/, or a `tf.py_function`) that returns, besides
   the outputs, a one-byte handle tensor: a DLPack view of a torch tensor that
   owns the `_saved.Saved` record. TF keeps the handle exactly as long as a gradient
   may still need it (not at all in an inference call, until the backward in a
   training call) and then frees it, which frees the record: no leak and no
   guessing whether a tape is active. The native op also tells the callback
   whether anything in the running graph consumes the handle; when nothing
   does (an inference call), no autograd graph is recorded and no handle is
   made at all.
"""

import functools

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._crossing import _adopt
from torchbridge._frameworks import _compat
from torchbridge._crossing import _exchange
from torchbridge._native import _loader
from torchbridge._native import _op
from torchbridge._runtime import _placement
from torchbridge._call import _saved
from torchbridge._call import _signature
from torchbridge._runtime import _timeline
from torchbridge._runtime import _thread_state

def is_differentiable(dtype):
  """Whether gradients flow through values of this TF dtype."""
  return tf.as_dtype(dtype).is_floating


# Graph ops whose output no gradient reaches.
_GRADIENT_STOPPERS = frozenset(("StopGradient", "PreventGradient"))


def can_get_gradients(args_tf, differentiable):
  """`differentiable`, narrowed to the arguments a gradient can be asked for.

  Eagerly, the ones a tape watches (when no tape records, none: the call
  builds no autograd graph); in a graph, those that are not the output of
  `tf.stop_gradient`. torch then makes leaves only of those, so code that
  torch cannot differentiate with respect to an unwatched argument (a
  loss's target) runs under a tape too.
  """
  if tf.executing_eagerly():
    if not _compat.tape_could_record():
      return [False] * len(differentiable)
    return [diff and _compat.tape_watches(a)
            for a, diff in zip(args_tf, differentiable)]
  return [diff and a.op.type not in _GRADIENT_STOPPERS
          for a, diff in zip(args_tf, differentiable)]


def call(compute, args_tf, out_specs=None, name="torch_call",
         differentiable=None, infer=None, specs_found=_signature.DECLARED):
  """Runs `compute` as one differentiable TF op on `args_tf`.

  Args:
    compute: `compute(args_torch, record, unused=None) -> _saved.Saved`,
      given
      zero-copy torch views of the arguments; with `record` it must make the
      differentiable arguments torch leaves that require grad and build the
      autograd graph. In an inference call inside a graph (nothing consumes
      the handle), `unused` is the tuple of the op's outputs nothing
      consumes (output k + 1 is `compute`'s output k) and may be ignored.
    args_tf: flat list of TF tensors.
    out_specs: flat list of `tf.TensorSpec` of the outputs, required when
      tracing a `tf.function`.
    name: name of the op in TF graphs.
    differentiable: optional list of bools, one per argument: which ones get
      gradients. Defaults to the floating ones.
    infer: optional `infer(args_torch) -> list of torch outputs`, the lean
      form of `compute` for inference calls inside a graph (no recording,
      no `_saved.Saved`; it runs with grad mode off). Defaults to `compute`'s
      outputs.
    specs_found: how `out_specs` were found, for the error of a call whose
      outputs do not match them.

  Returns:
    Flat list of TF tensors.
  """
  if differentiable is None:
    differentiable = [is_differentiable(a.dtype) for a in args_tf]
  _placement.remember_user_threads()  # on the user's thread
  if tf.executing_eagerly():
    return _call_eager(compute, args_tf, differentiable)
  _placement.graph_call_traced()
  return _call_graph(compute, args_tf, args_tf, out_specs, True, name,
                     differentiable, infer, specs_found)


def _call_eager(compute, args_tf, differentiable, n_used=None):
  """Eagerly: `compute` sees torch views of the first `n_used` arguments."""
  if n_used is None:
    n_used = len(args_tf)
  # On the calling thread, the user's own: no hand-over (see
  # README, "One torch thread": one costs 40-90 us here, more than an
  # eager call).
  if not (_compat.tape_could_record() and any(differentiable)):
    with torch.no_grad(), _timeline.span(_timeline.CALL):
      saved = compute(_views(args_tf[:n_used]), False)
    return [_to_tf_or_none(o) for o in saved.outs_torch]

  @tf.custom_gradient
  def bridged(*args):
    with torch.enable_grad(), _timeline.span(_timeline.CALL):
      saved = compute(_views(args[:n_used]), True)
    outs_tf = [_to_tf_or_none(o) for o in saved.outs_torch]

    def grad(*dys_tf):
      # Gradients are themselves bridged calls, so an outer tape that
      # records this backward can differentiate it again.
      specs = [tf.TensorSpec(o.shape, o.dtype) for o in outs_tf]
      sel_out, diff_args = _grad_positions(specs, differentiable, dys_tf)
      # Its arguments: the upstream gradients, which torch reads, and the
      # forward's arguments, which only connect the tape (their torch leaves
      # live in `saved`).
      grads_tf = _call_eager(
          functools.partial(_saved.backward, saved, sel_out, diff_args,
                            none_ok=True),
          [dys_tf[i] for i in sel_out] + [args[j] for j in diff_args],
          [True] * (len(sel_out) + len(diff_args)), n_used=len(sel_out))
      return _scatter(grads_tf, diff_args, len(args))

    return outs_tf, grad

  return list(bridged(*args_tf))


def _call_graph(compute, grad_args_tf, py_args_tf, out_specs, record, name,
                differentiable, infer=None, specs_found=_signature.DECLARED):
  """`compute` inside a graph, as one stateful op returning a handle too.

  `grad_args_tf` are the tensors TF differentiates against; `py_args_tf` the
  tensors the Python body receives (for a backward: the handle of the
  forward and the upstream gradients, not the forward's arguments, which
  live on in its `_saved.Saved` record).
  """

  check_outputs = _OutputCheck(out_specs, name, specs_found)

  def run(py_args_torch, unused=None):
    # The tf.py_function path: handed to the torch thread from here.
    with _timeline.span(_timeline.HAND_OFF):
      return _placement.run_graph_call(run_here, py_args_torch, unused)

  def run_native(py_args_torch, unused=None):
    # On the native op's torch thread already (CPU), or on TF's thread with
    # TF's CUDA stream as torch's (GPU: no OpenMP teams there).
    _placement.prepare_native_call()
    return run_here(py_args_torch, unused)

  def run_here(py_args_torch, unused=None):
    # `unused`: the outputs nothing in the running graph consumes (None: not
    # known). In an inference call nothing consumes the handle (output 0):
    # then no autograd graph is recorded and no handle is made.
    with _timeline.span(_timeline.CALL):
      return _run_here(py_args_torch, unused)

  def _run_here(py_args_torch, unused):
    inference = unused is not None and 0 in unused
    grad_mode = torch.is_grad_enabled()
    torch.set_grad_enabled(record and not inference)
    try:
      if inference:
        saved = None
        outs_torch = (infer(py_args_torch) if infer is not None else
                      compute(py_args_torch, False, unused).outs_torch)
      else:
        saved = compute(py_args_torch, record)
        outs_torch = saved.outs_torch
    finally:
      torch.set_grad_enabled(grad_mode)
    with _timeline.span(_timeline.CHECK):
      check_outputs(outs_torch)
    if saved is None:
      return [None] + outs_torch
    with _timeline.span(_timeline.SAVE):
      handle_torch = torch.empty(1, dtype=torch.int8,
                                 device=_handle_device(outs_torch))
      _saved.own(handle_torch, saved)
    return [handle_torch] + outs_torch

  @tf.custom_gradient
  def bridged(*grad_args):
    results = _stateful_op(run, run_native, py_args_tf,
                           [tf.int8] + [s.dtype for s in out_specs],
                           [[1]] + [s.shape for s in out_specs], name)
    handle_tf, outs_tf = results[0], results[1:]

    def grad(*dys_tf):
      sel_out, diff_args = _grad_positions(out_specs, differentiable, dys_tf)

      def compute_bwd(py_args_torch, rec, unused=None):
        saved = _saved.lookup(py_args_torch[0])
        # Output k + 1 of this op is the gradient of argument diff_args[k];
        # the native op says which ones nothing consumes (e.g. those of
        # inputs no tape watches): those are not computed, unless a
        # higher-order gradient will differentiate this backward (it then
        # consumes the handle, output 0, and `unused` is not passed), which
        # reaches them through torch's graph rather than through TF's edges.
        skip = [k - 1 for k in unused or () if k > 0]
        return _saved.backward(saved, sel_out, diff_args, py_args_torch[1:],
                               rec, skip)

      dys_sel_tf = [dys_tf[i] for i in sel_out]
      # The backward may be traced in another graph than the forward (the
      # backward function of a tf.function); identities capture the
      # forward's tensors there, so that a gradient of this backward, traced
      # in yet another graph, refers to tensors of its parent graph only.
      xs_tf = [_in_current_graph(grad_args[j]) for j in diff_args]
      grads_tf = _call_graph(
          compute_bwd,
          dys_sel_tf + xs_tf,
          [_in_current_graph(handle_tf)] + dys_sel_tf,
          [tf.TensorSpec(grad_args[j].shape, grad_args[j].dtype)
           for j in diff_args],
          # Build the double-backward graph only when a tape records this
          # backward; otherwise a later request recomputes it (regraph).
          _compat.tape_could_record(),
          name + "_grad",
          [True] * (len(sel_out) + len(diff_args)))
      return _scatter(grads_tf, diff_args, len(grad_args))

    return outs_tf, grad

  return list(bridged(*grad_args_tf))


def _stateful_op(run, run_native, inputs_tf, out_dtypes, out_shapes, name):
  """One stateful graph op running `run(list of torch views) -> tensors`.

  The native op of `csrc/` when it is available (it hands torch tensors to
  `run_native` directly, on its torch thread); otherwise a
  `tf.py_function`, whose body receives eager tensors and returns eager
  tensors, both through DLPack, and calls `run`.
  """
  if _loader.available():
    # Output 0 is the handle, whose Python object owns the `_saved.Saved`
    # record.
    return _op.call(run_native, inputs_tf, out_dtypes, out_shapes, name=name,
                        torch_tensors=True, whole_tensor_outputs=[0])

  def body(*inputs_eager):
    _thread_state.keep_for_this_thread()
    with _timeline.span(_timeline.TO_TORCH):
      inputs_torch = _views(inputs_eager)
    outs_torch = run(inputs_torch)
    with _timeline.span(_timeline.TO_TF):
      return [_exchange.tensor_to_tf(o) for o in outs_torch]

  outs_tf = tf.py_function(body, inputs_tf, Tout=out_dtypes, name=name)
  for out_tf, shape in zip(outs_tf, out_shapes):
    out_tf.set_shape(shape)
  return outs_tf


def _to_tf_or_none(out_torch):
  # None: a gradient torch cannot give (see _saved.backward).
  return None if out_torch is None else _exchange.tensor_to_tf(out_torch)


def _views(tensors_tf):
  return [_exchange.tensor_to_torch(t) for t in tensors_tf]


def _handle_device(outs_torch):
  """Where the handle lives: on the op's device, so TF never moves it."""
  gpu = _placement.current_gpu()
  if gpu is not None:
    return torch.device("cuda", gpu)
  return next((o.device for o in outs_torch if o is not None and o.is_cuda),
              torch.device("cpu"))


def _in_current_graph(tensor_tf):
  if tensor_tf.graph is tf.compat.v1.get_default_graph():
    return tensor_tf
  return tf.identity(tensor_tf)  # captures it into this graph


def _grad_positions(out_specs, differentiable, dys_tf):
  """Which outputs send gradient back, and which arguments receive it."""
  sel_out = [i for i, (spec, dy) in enumerate(zip(out_specs, dys_tf))
             if dy is not None and is_differentiable(spec.dtype)]
  diff_args = [j for j, diff in enumerate(differentiable) if diff]
  return sel_out, diff_args


def _scatter(grads_tf, positions, n):
  result = [None] * n
  for pos, g in zip(positions, grads_tf):
    result[pos] = g
  return result


class _OutputCheck:
  """Checks a call's torch outputs against the specs declared at trace time.

  The specs are turned into plain tuples once, so the check costs little on
  every run.
  """

  def __init__(self, out_specs, name, specs_found):
    self._specs = out_specs
    self._name = name
    self._found = specs_found
    # (torch dtype, whether the shape is fully known, its dims as a tuple
    # with None for unknown ones, or None for an unknown rank).
    self._expected = [
        (_adopt.torch_dtype(s.dtype), s.shape.is_fully_defined(),
         None if s.shape.rank is None else tuple(s.shape.as_list()))
        for s in out_specs]
    # The common case, one output of a fully known shape: (dtype, dims).
    self._single = None
    if len(self._expected) == 1 and self._expected[0][1]:
      self._single = (self._expected[0][0], self._expected[0][2])

  def __call__(self, outs_torch):
    if self._single is not None and len(outs_torch) == 1:
      out = outs_torch[0]
      if (out is not None and out.dtype == self._single[0] and
          out.shape == self._single[1]):
        return
    if len(outs_torch) == len(self._expected):
      for out, (dtype, known, dims) in zip(outs_torch, self._expected):
        if out is None:  # left out because nothing consumes it
          continue
        if out.dtype != dtype or (out.shape != dims if known else
                                  not _dims_match(dims, out.shape)):
          break
      else:
        return
    _check_outputs(outs_torch, self._specs, self._name, self._found)


def _dims_match(dims, shape):
  if dims is None:
    return True
  return len(dims) == len(shape) and all(
      d is None or d == n for d, n in zip(dims, shape))


def _check_outputs(outs_torch, out_specs, name, found):
  """Raises the error that says how the outputs differ from the specs."""
  if len(outs_torch) != len(out_specs):
    raise ValueError(
        f"{name} returned {len(outs_torch)} tensors, but {len(out_specs)} "
        "were declared when the tf.function was traced. The torch code must "
        "return the same structure on every call.")
  for k, (out, spec) in enumerate(zip(outs_torch, out_specs)):
    if out is None:  # left out because nothing consumes it
      continue
    if out.dtype != _adopt.torch_dtype(spec.dtype):
      raise TypeError(
          f"{name} output {k} has dtype {out.dtype}, but {spec.dtype.name} "
          f"was declared when the tf.function was traced ({found}). "
          f"{_WAY_OUT[found]}")
    if not spec.shape.is_compatible_with(out.shape):
      raise ValueError(
          f"{name} output {k} has shape {tuple(out.shape)}, but "
          f"{spec.shape} was declared when the tf.function was traced "
          f"({found}). {_WAY_OUT[found]}")


# What to do when a call's outputs differ from the specs, by how the specs
# were found.
_WAY_OUT = {
    _signature.META: (
        "Torch's meta kernel of an op in this code gives another shape or "
        "dtype than its CPU/CUDA kernel, or the shape depends on the values. "
        "Declare the outputs: pass output_signature= (None for dimensions "
        "that vary) to tb.torch_function / tb.TorchModule / TorchLayer."),
    _signature.REAL: (
        "The shape depends on the values, which the stand-in run could not "
        "know. Declare the outputs: pass output_signature= (None for "
        "dimensions that vary) to tb.torch_function / tb.TorchModule / "
        "TorchLayer."),
    _signature.DECLARED: (
        "Return what output_signature declares, or fix output_signature "
        "(None for dimensions that vary)."),
}
