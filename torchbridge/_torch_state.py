"""The variables that mirror a torch module's state, and calls through them.

Shared by `TorchModule` (plain `tf.Variable`s) and `keras.TorchLayer`
(`keras.Variable`s): both hand this class a dict of variables, and it runs
the torch module on their current values.
"""

import collections.abc
import copy
import functools
import threading
import weakref

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf
from torch.utils._python_dispatch import TorchDispatchMode

from torchbridge import _bridge
from torchbridge import _compiled
from torchbridge import _distribute
from torchbridge import _exchange
from torchbridge import _function
from torchbridge import _swap

_TRAINING_NOT_BOOL = """\
{name}(training=...) must be None, True or False, got {received!r}. Inside
tf.function the torch mode is fixed when tracing: pass a Python bool (Keras
does), or call the module in two tf.functions, one per mode."""


class TorchState:
  """A torch module whose parameters and buffers live in TF variables.

  Args:
    module: the torch `nn.Module`.
    owner_name: the wrapper's name, for errors.
    make_variable: `make_variable(name, initial_value_tf, trainable,
      aggregation)` -> a variable (`tf.Variable` or `keras.Variable`);
      `aggregation` is a `tf.VariableAggregation`, how replicas of a
      `tf.distribute` strategy combine their writes.
  """

  def __init__(self, module, owner_name, make_variable):
    check_module(module, owner_name)
    _distribute.check_strategy(owner_name)
    self.module = module
    self.name = owner_name
    params = dict(module.named_parameters())  # tied parameters appear once
    buffers = dict(module.named_buffers())
    lend_from_holders(list(params.values()) + list(buffers.values()))
    self.param_names = list(params)
    self.buffer_names = list(buffers)
    # state_dict name -> canonical name of the tensor it holds (tied
    # parameters have several state_dict names for one tensor).
    by_id = {id(t): n for n, t in list(params.items()) + list(buffers.items())}
    self.state_names = {n: by_id[id(t)] for n, t in
                        module.state_dict(keep_vars=True).items()}
    # torch modes -> names of the buffers the forward writes (learnt while
    # tracing or on the first eager call), so later calls copy only those.
    self._mutated_buffers = {}
    # One forward at a time: a call swaps tensors into the shared
    # torch module for the duration of a call.
    self._lock = threading.RLock()
    self._slots = _swap.TensorSlots(module, self.param_names +
                                    self.buffer_names)
    self._modules = list(module.modules())
    self.variables = {}
    for n, t in list(params.items()) + list(buffers.items()):
      trainable = n in params and t.requires_grad
      value_tf = tf_owned_copy(t)
      # Only buffers are written in replica context (by the forward).
      aggregation = (tf.VariableAggregation.NONE if n in params else
                     _distribute.buffer_aggregation(value_tf.dtype))
      self.variables[n] = make_variable(n, value_tf, trainable, aggregation)
    # The weights are held once, by the variables: the torch module's own
    # tensors now hold views of them (see `_TorchViews`).
    self._views = _TorchViews(
        self, module, {n: (t, self.variables[n]) for n, t in
               list(params.items()) + list(buffers.items())})

  def sync_torch(self):
    """Points the torch module's tensors at the variables; returns it.

    Zero-copy views of the current values, kept until the next bridged
    call (see `_TorchViews`).
    """
    with self._lock:
      self._views.lend()
    return self.module

  @tf.autograph.experimental.do_not_convert
  def call(self, args, kwargs, training):
    """Runs the forward on TF tensors; see `TorchModule.__call__`."""
    if training is not None:
      training = _as_python_bool(training, self.name)
    elif not tf.executing_eagerly():
      # The traced graph depends on the modes (which buffers the forward
      # writes, hence the op's outputs): every run of it uses the modes the
      # submodules had when it was traced.
      training = [m.training for m in self._modules]
    call = _function.bind_arguments(self.name, (args, kwargs))
    _distribute.check_call_context(self.name, self.variables.values())
    if not tf.executing_eagerly():
      _function.check_not_xla(self.name)
    names = self.param_names + self.buffer_names
    vars_tf = [tf.convert_to_tensor(self.variables[n]) for n in names]
    n_params, n_vars = len(self.param_names), len(names)
    mode_key = self._mode_key(training)
    # (buffer name, torch tensor written by the forward), per thread: a traced
    # function may run in several threads at once.
    written = threading.local()

    def run(args_torch):
      with self._lock:
        views = self._views
        views.take_back()
        views.calls_running += 1
        if views.calls_running == 1:
          views.suspend_hooks()
        try:
          return locked_run(args_torch)
        finally:
          views.calls_running -= 1
          if not views.calls_running:
            views.resume_hooks()

    def locked_run(args_torch):
      known_mutated = self._mutated_buffers.get(mode_key)
      buffers_torch = {}
      for n, b in zip(self.buffer_names, args_torch[n_params:n_vars]):
        if b.is_meta and b.dim() == 0:
          # Finding the output shapes on meta tensors while tracing: scalar
          # buffers (BatchNorm's num_batches_tracked, which its forward may
          # read with `.item()`) get their current value, on the CPU, where
          # torch lets 0-d tensors mix with any device.
          with tf.init_scope():
            b = _exchange.tensor_to_torch(
                tf.convert_to_tensor(self.variables[n])).cpu()
        # Buffers the forward may write get a private copy, so torch never
        # writes into a TF buffer behind TF's back; the copy is then
        # assigned to the variable (which adopts it without copying).
        if known_mutated is None or n in known_mutated:
          b = b.clone()
        buffers_torch[n] = b
      tensors = dict(zip(self.param_names, args_torch[:n_params]))
      tensors.update(buffers_torch)
      a, kw = call.substitute(args_torch[n_vars:])
      with _torch_mode(self.module, self._modules, training), \
          _explain_dtype_errors(self.name, self.module, args_torch[n_vars:]):
        if known_mutated is None:
          # The first call in this mode (eagerly, or on meta tensors while
          # tracing) finds the buffers the forward writes; later calls in
          # this mode copy and write back exactly those.
          versions = {n: b._version for n, b in buffers_torch.items()}
          with _compiled.run_uncompiled(), _WriteRecorder() as recorder:
            result, reassigned = self._slots.call(tensors, a, kw)
          known_mutated = frozenset(
              n for n, b in buffers_torch.items()
              if b._version != versions[n] or recorder.wrote(b) or
              n in reassigned)
        else:
          result, reassigned = self._slots.call(tensors, a, kw)
      # A buffer the forward replaced (`self.buf = ...`) has its new value
      # in the new tensor.
      for n, t in reassigned.items():
        if n in buffers_torch:
          buffers_torch[n] = t
      written.items = [(n, b) for n, b in buffers_torch.items()
                       if n in known_mutated]
      return result

    def extra(args_torch, result):
      del args_torch, result
      return [b for _, b in written.items]

    differentiable = (
        [self.variables[n].trainable for n in self.param_names] +
        [False] * len(self.buffer_names) +
        [_bridge.is_differentiable(a.dtype) for a in call.args_tf])
    result, written_tf = _function.call_bridged(
        run, vars_tf + call.args_tf, self.name, extra=extra,
        differentiable=differentiable)
    self._mutated_buffers[mode_key] = frozenset(n for n, _ in written.items)
    for (n, _), value_tf in zip(written.items, written_tf):
      self.variables[n].assign(value_tf)
    return result

  def _mode_key(self, training):
    if isinstance(training, list):
      return "".join("1" if mode else "0" for mode in training)
    if training is not None:
      return str(bool(training))
    return "".join("1" if m.training else "0" for m in self._modules)

  def get_weights(self):
    """`{state_dict name: np.ndarray}`, copies of the current values."""
    return {n: np.array(self.variables[c].numpy(), copy=True)
            for n, c in self.state_names.items()}

  def set_weights(self, weights):
    """Sets every variable from `{state_dict name: array}`, all or nothing."""
    if not isinstance(weights, collections.abc.Mapping):
      raise TypeError(
          f"{self.name}.set_weights() expects a mapping from torch "
          f"state_dict names to arrays, got {type(weights).__name__}. Pass "
          "the dict that get_weights() returns, or a torch state_dict.")
    expected = set(self.state_names)
    missing = sorted(expected - set(weights))
    unexpected = sorted(set(weights) - expected)
    problems = []
    if missing:
      problems.append(f"missing names: {missing}")
    if unexpected:
      problems.append(f"unexpected names: {unexpected}")
    values = {}
    first_name = {}  # canonical name -> the state_dict name that set it
    for n in sorted(expected & set(weights)):
      var = self.variables[self.state_names[n]]
      value = _as_numpy(weights[n], n, self.name)
      if tuple(value.shape) != tuple(var.shape):
        problems.append(
            f"{n!r} has shape {tuple(value.shape)}, expected "
            f"{tuple(var.shape)}")
        continue
      canonical = self.state_names[n]
      if canonical in values:
        if not np.array_equal(values[canonical], value):
          problems.append(
              f"{first_name[canonical]!r} and {n!r} are one tied tensor in "
              "torch but have different values")
        continue
      values[canonical] = value
      first_name[canonical] = n
    if problems:
      raise ValueError(
          f"{self.name}.set_weights() got weights that do not fit the torch "
          f"module: {'; '.join(problems)}. Expected exactly the names of "
          f"its state_dict: {sorted(expected)}.")
    for canonical, value in values.items():
      var = self.variables[canonical]
      dtype = tf.as_dtype(var.dtype)
      var.assign(_tf_owned(tf.constant(value.astype(dtype.as_numpy_dtype))))


def tf_owned_copy(tensor_torch):
  """A TF tensor holding a copy of a torch tensor, in a TF-allocated buffer.

  A variable whose buffer came from DLPack or numpy cannot be updated in
  place: TF copies it on the first optimizer step. Starting from a buffer TF
  allocated keeps every update in place. Placed on the torch tensor's device.
  """
  if tensor_torch.is_cuda:
    device = "/GPU:%d" % tensor_torch.device.index
  else:
    device = "/CPU:0"
  with tf.device(device):
    return _tf_owned(_exchange.tensor_to_tf(tensor_torch.detach()))


def _tf_owned(value_tf):
  try:
    return tf.raw_ops.DeepCopy(x=value_tf)
  except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError):
    return value_tf  # no kernel for this dtype and device: TF copies once


def check_is_module(module, owner_name):
  """Raises a TypeError, with the fix, for anything but a torch module."""
  if not isinstance(module, torch.nn.Module):
    raise TypeError(
        f"{owner_name} expects a torch.nn.Module, got {module!r} of type "
        f"{type(module).__name__}. Wrap a plain torch function with "
        "tb.torch_function instead: `f = tb.torch_function(fn)`.")


def check_module(module, owner_name):
  """Raises for modules that cannot be wrapped (not a module, lazy, meta)."""
  check_is_module(module, owner_name)
  for n, t in list(module.named_parameters()) + list(module.named_buffers()):
    if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
      raise ValueError(
          f"{owner_name}: torch parameter or buffer {n!r} is not initialized "
          "yet (a lazy module such as nn.LazyLinear). Run the torch module "
          "once on an example input before wrapping it, e.g. "
          "`module(torch.zeros(1, in_features))`.")
    if t.is_meta:
      raise ValueError(
          f"{owner_name}: torch parameter or buffer {n!r} is on the meta "
          "device and holds no values. Materialize it first, e.g. "
          "`module.to_empty(device='cpu')`, then initialize or load weights.")


_HOLDERS = {}  # id(torch tensor) -> (weakref to it, weakref to _TorchViews)


class _TorchViews:
  """The torch module's own tensors, pointed at its variables' values.

  TF copies a variable's buffer before an in-place update when anything
  else references it (`PrepareToUpdateVariable`), so a torch view kept
  across an optimizer step would cost a copy of the weights per step and go
  stale. The module's tensors are therefore lent zero-copy views of the
  current values only between bridged calls: right after wrapping, when
  `torch_module` is read, and when the torch module or any submodule is
  called or its `state_dict()` taken outside a bridged call (hooks, taken
  out during bridged calls).
  A bridged call takes them back, leaving placeholders that hold no memory
  (one element, NaN for floating dtypes, broadcast to the tensor's shape);
  calls never read these tensors, they swap the variables' values into the
  module's slots. While taken back, each tensor's class is a subclass of its
  own (`_lending_class`) whose `copy.deepcopy` and pickling (`torch.save`)
  lend the views first, so copies hold the values.

  When the wrapper is garbage collected, the torch tensors get copies of
  the last values and the hooks are removed, so a torch module outlives its
  wrapper intact. A tensor held by another live wrapper (a module wrapped
  twice, or a submodule of a wrapped module) is first pointed at that
  wrapper's current values (`lend_from_holders`).
  """

  def __init__(self, state, module, pairs):
    # canonical name -> (torch tensor, variable)
    self._pairs = pairs
    self.lent = False
    self.calls_running = 0
    ref = weakref.ref(self)
    for t, _ in pairs.values():
      _HOLDERS[id(t)] = (weakref.ref(t, _forget(id(t))), ref)
    hooks = []
    # (the module's forward pre-hook dict, key, hook): taken out during
    # bridged calls, where the hooks would only cost time.
    self._forward_hooks = []
    for sub in module.modules():
      handle = sub.register_forward_pre_hook(_LendOnUse(ref, "forward"))
      hooks.append(handle)
      table = sub._forward_pre_hooks  # pylint: disable=protected-access
      self._forward_hooks.append((table, handle.id, table[handle.id]))
      hooks.append(sub.register_state_dict_pre_hook(
          _LendOnUse(ref, "state_dict")))
    self.lend()
    finalizer = weakref.finalize(state, _copy_back, list(pairs.values()),
                                 hooks)
    finalizer.atexit = False  # at exit nothing reads the torch module again

  def lend(self):
    """Points every torch tensor at a zero-copy view of its variable."""
    with tf.init_scope(), torch.no_grad():
      for t, var in self._pairs.values():
        t.data = _exchange.tensor_to_torch(tf.convert_to_tensor(var))
        original = getattr(type(t), "_torchbridge_original_class", None)
        if original is not None:
          t.__class__ = original
    self.lent = True

  def suspend_hooks(self):
    """Takes the forward hooks out for a bridged call."""
    for table, key, _ in self._forward_hooks:
      table.pop(key, None)

  def resume_hooks(self):
    for table, key, hook in self._forward_hooks:
      table[key] = hook

  def take_back(self):
    """Replaces the views with placeholders (no-op when none are lent)."""
    if not self.lent:
      return
    with torch.no_grad():
      for t, _ in self._pairs.values():
        t.data = _placeholder(t)
        t.__class__ = _lending_class(type(t))
    self.lent = False


class _LendOnUse:
  """A hook on each torch submodule: lends the views when torch code uses
  the module outside a bridged call (a forward, `state_dict()`).

  Pickled or deep-copied with the module (`torch.save(module)`,
  `copy.deepcopy(module)`), it becomes a no-op that needs no torchbridge
  to load: the copy is a plain torch module.
  """

  def __init__(self, views_ref, kind):
    self._views_ref = views_ref
    self._kind = kind

  def __call__(self, module, *unused):
    views = self._views_ref()
    if views is not None and not views.lent and not views.calls_running:
      views.lend()

  def __reduce__(self):
    if self._kind == "forward":  # `{}.get(module, args)` returns args
      return getattr, ({}, "get")
    return functools.partial, (slice,)  # takes three arguments, unused


_LENDING_CLASSES = {}


def _lending_class(cls):
  """A subclass of a torch tensor class whose deepcopy and pickling first
  lend the views of the wrapper holding the tensor (see `_TorchViews`)."""
  if "_torchbridge_original_class" in cls.__dict__:
    return cls
  lending = _LENDING_CLASSES.get(cls)
  if lending is None:
    lending = type(cls.__name__, (cls,), {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "_torchbridge_original_class": cls,
        "__torch_function__": torch._C._disabled_torch_function_impl,  # pylint: disable=protected-access
        "__deepcopy__": _deepcopy_lent,
        "__reduce_ex__": _reduce_ex_lent,
    })
    _LENDING_CLASSES[cls] = lending
  return lending


def _lend_or_restore(tensor_torch):
  lend_from_holders([tensor_torch])
  original = getattr(type(tensor_torch), "_torchbridge_original_class", None)
  if original is not None:  # no live holder: nothing to lend
    tensor_torch.__class__ = original


def _deepcopy_lent(self, memo):
  _lend_or_restore(self)
  return copy.deepcopy(self, memo)


def _reduce_ex_lent(self, protocol):
  _lend_or_restore(self)
  return self.__reduce_ex__(protocol)


def lend_from_holders(tensors_torch):
  """Points tensors that another live wrapper holds at its values."""
  for t in tensors_torch:
    entry = _HOLDERS.get(id(t))
    if entry is not None and entry[0]() is t:
      holder = entry[1]()
      if holder is not None:
        holder.lend()


def _forget(key):
  def callback(_):
    entry = _HOLDERS.get(key)
    if entry is not None and entry[0]() is None:
      del _HOLDERS[key]
  return callback


def _copy_back(pairs, hooks):
  """Gives torch tensors copies of their variables' last values."""
  for handle in hooks:
    handle.remove()
  with tf.init_scope(), torch.no_grad():
    for t, var in pairs:
      t.data = _exchange.tensor_to_torch(tf.convert_to_tensor(var)).clone()
      original = getattr(type(t), "_torchbridge_original_class", None)
      if original is not None:
        t.__class__ = original


def _placeholder(tensor_torch):
  fill = (float("nan") if tensor_torch.is_floating_point() or
          tensor_torch.is_complex() else 0)
  one = torch.full((), fill, dtype=tensor_torch.dtype,
                   device=tensor_torch.device)
  return one.expand(tensor_torch.shape)


# Kernels that update the running statistics (arguments 3 and 4) in place when
# their `training` argument (5) is true, with no write annotation in their
# schema, and so without bumping the tensors' version counters.
_UNANNOTATED_STATS_WRITERS = frozenset((
    "aten::native_batch_norm", "aten::cudnn_batch_norm",
    "aten::miopen_batch_norm"))


class _WriteRecorder(TorchDispatchMode):
  """Records the storages that the torch ops run under it write to.

  A write shows in the op's schema (`Tensor(a!)`), except for the batch
  norm kernels, which update the running statistics in place undeclared
  (and leave the version counters alone).
  """

  def __init__(self):
    super().__init__()
    self._storages = set()

  def wrote(self, tensor_torch):
    return tensor_torch.untyped_storage()._cdata in self._storages

  def _record(self, value):
    for t in value if isinstance(value, (list, tuple)) else [value]:
      if isinstance(t, torch.Tensor):
        self._storages.add(t.untyped_storage()._cdata)

  def __torch_dispatch__(self, func, types, args=(), kwargs=None):
    kwargs = kwargs or {}
    schema = func._schema
    for k, arg in enumerate(schema.arguments):
      if arg.alias_info is not None and arg.alias_info.is_write:
        self._record(args[k] if k < len(args) else kwargs.get(arg.name))
    if schema.name in _UNANNOTATED_STATS_WRITERS and len(args) > 5 \
        and args[5]:
      self._record([args[3], args[4]])
    return func(*args, **kwargs)


_DTYPE_MISMATCH = """\
{name}: the torch module failed on {inputs}.
Its floating parameters are {param}, and torch does not convert dtypes:
  {error_type}: {error}
Cast the inputs to {param} before the call, e.g. `tf.cast(x, tf.{param})` (in
a Keras model: `keras.Input(shape, dtype="{param}")`){module_fix}."""


class _explain_dtype_errors:
  """Re-raises a torch error that inputs of the wrong dtype likely caused
  with a message naming the input and parameter dtypes and the fix."""

  def __init__(self, name, module, inputs_torch):
    self._name = name
    self._module = module
    self._inputs = inputs_torch

  def __enter__(self):
    return self

  def __exit__(self, exc_type, err, tb):
    if not isinstance(err, (RuntimeError, TypeError)) or \
        "type" not in str(err).lower():
      return False
    params = sorted({str(p.dtype).replace("torch.", "")
                     for p in self._module.parameters()
                     if p.is_floating_point()})
    odd = [(k, t) for k, t in enumerate(self._inputs)
           if str(t.dtype).replace("torch.", "") not in params]
    if len(params) != 1 or not odd:
      return False
    inputs = ", ".join(
        f"input {k} of dtype {str(t.dtype).replace('torch.', '')} (shape "
        f"{tuple(t.shape)})" for k, t in odd)
    module_fix = ""
    if all(t.is_floating_point() for _, t in odd):
      module_fix = (", or convert the torch module to the inputs' dtype "
                    "before wrapping it (e.g. `module.double()`)")
    message = _DTYPE_MISMATCH.format(
        name=self._name, inputs=inputs, param=params[0],
        error_type=type(err).__name__, error=err, module_fix=module_fix)
    try:
      explained = type(err)(message)
    except Exception:  # an exception type whose constructor wants more
      explained = RuntimeError(message)
    raise explained from err


class _torch_mode:
  """Sets train/eval mode on a torch module for one call, then restores it.

  `training` is None (leave the modes), a bool (for every submodule), or a
  list of bools, one per module of `modules` (`list(module.modules())`).
  Modules already in the wanted mode are left alone, so the usual call (the
  modes as they are) costs a comparison per submodule.
  """

  def __init__(self, module, modules, training):
    self._module = module
    self._modules = modules
    self._training = training
    self._saved = None

  def __enter__(self):
    training = self._training
    if training is None:
      return
    if isinstance(training, bool):
      if any(m.training != training for m in self._modules):
        self._saved = [(m, m.training) for m in self._modules]
        self._module.train(training)
      return
    for m, mode in zip(self._modules, training):
      if m.training != mode:
        if self._saved is None:
          self._saved = [(m, m.training) for m in self._modules]
        m.training = mode

  def __exit__(self, *exc_info):
    if self._saved is not None:
      for m, mode in self._saved:
        m.training = mode


def _as_python_bool(training, name):
  if isinstance(training, (bool, np.bool_)):
    return bool(training)
  if (isinstance(training, (tf.Tensor, tf.Variable)) and
      tf.executing_eagerly() and training.dtype == tf.bool and
      training.shape.rank == 0):
    return bool(training.numpy())
  raise TypeError(_TRAINING_NOT_BOOL.format(name=name, received=training))


def _as_numpy(value, key, name):
  if isinstance(value, torch.Tensor):
    value = value.detach().cpu()
    if value.dtype == torch.bfloat16:
      return _exchange.tensor_to_tf(value).numpy()
    return value.numpy()
  if isinstance(value, (tf.Tensor, tf.Variable)):
    return value.numpy()
  try:
    array = np.asarray(value)
  except Exception as err:
    raise TypeError(
        f"{name}.set_weights(): entry {key!r} is a {type(value).__name__}, "
        "expected a numpy array or a tensor.") from err
  if array.dtype == object or array.dtype.kind in "USV":
    raise TypeError(
        f"{name}.set_weights(): entry {key!r} has dtype {array.dtype}, "
        "expected numeric values (a numpy array or a tensor).")
  return array
