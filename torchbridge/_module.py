"""`TorchModule`: a torch `nn.Module` whose state lives in TF variables."""

import collections.abc
import re
import threading

import numpy as np
import tensorflow as tf
import torch
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode

from torchbridge import _bridge
from torchbridge import _exchange
from torchbridge import _function

_NOT_A_MODULE = """\
TorchModule(module) expects a torch.nn.Module, got {received!r} of type
{type_name}. Wrap a plain torch function with tb.torch_function instead:
  f = tb.torch_function(fn)"""

_TRAINING_NOT_BOOL = """\
{name}(training=...) must be None, True or False, got {received!r}. Inside
tf.function the torch mode is fixed when tracing: pass a Python bool (Keras
does), or call the module in two tf.functions, one per mode."""


class TorchModule(tf.Module):
  """A torch `nn.Module` as a `tf.Module`, its state held by TF variables.

  Each parameter and buffer of the torch module gets one `tf.Variable`,
  named after its torch path (`actor/l1.weight`); the variables are the
  truth. Each call hands torch zero-copy views of their current values
  (through `torch.func.functional_call`), so any TF optimizer, `assign` or
  checkpoint restore is seen by the next call, and nothing is copied per
  step. Buffers that torch updates in the forward (BatchNorm running
  statistics, counters) are written back to their variables.

  Calls work eagerly and inside `tf.function`, with the gradient behaviour of
  `tb.torch_function`: gradients reach the floating inputs and the trainable
  variables (parameters with `requires_grad=True`); frozen parameters and
  buffers get none.

  `training=True/False` puts the torch module (and every submodule) in
  train or eval mode for that call only; `training=None` leaves torch's own
  mode as it is (inside `tf.function`: the modes the submodules had when the
  function was traced, since the traced graph depends on them).

  `torch_module` gives back the torch module holding the current TF values;
  `get_weights()` / `set_weights()` exchange `{state_dict name: np.ndarray}`.

  Example:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> torch.manual_seed(0) and None
    >>> actor = tb.TorchModule(torch.nn.Linear(3, 2), name="actor")
    >>> [v.name for v in actor.trainable_variables]
    ['actor/bias:0', 'actor/weight:0']
    >>> opt = tf.keras.optimizers.SGD(0.1)
    >>> with tf.GradientTape() as tape:
    ...   loss = tf.reduce_sum(actor(tf.ones([4, 3])) ** 2)
    >>> opt.apply_gradients(zip(tape.gradient(loss, actor.trainable_variables),
    ...                         actor.trainable_variables)) and None
    >>> bool(torch.equal(actor.torch_module.weight,
    ...                  torch.from_numpy(actor.get_weights()["weight"])))
    True
  """

  def __init__(self, module, name=None):
    if not isinstance(module, torch.nn.Module):
      raise TypeError(_NOT_A_MODULE.format(
          received=module, type_name=type(module).__name__))
    super().__init__(name=name or _snake_case(type(module).__name__))
    _check_materialized(module, self.name)
    params = dict(module.named_parameters())  # tied parameters appear once
    buffers = dict(module.named_buffers())
    self._init_untracked(module, params, buffers)
    with self.name_scope:
      self._tf_variables = {
          n: _variable_like(t, n, trainable=t.requires_grad)
          for n, t in params.items()}
      self._tf_variables.update({
          n: _variable_like(t, n, trainable=False)
          for n, t in buffers.items()})

  # Plain Python state, kept out of TF's checkpoint dependencies and out of
  # `tf.Module.variables`: only the variables are the module's TF state.
  _TF_MODULE_IGNORED_PROPERTIES = frozenset((
      "_torch_module", "_param_names", "_buffer_names", "_state_names",
      "_mutated_buffers", "_lock")).union(
          tf.Module._TF_MODULE_IGNORED_PROPERTIES)

  @tf.__internal__.tracking.no_automatic_dependency_tracking
  def _init_untracked(self, module, params, buffers):
    self._torch_module = module
    self._param_names = list(params)
    self._buffer_names = list(buffers)
    # state_dict name -> canonical name of the tensor it holds (tied
    # parameters have several state_dict names for one tensor).
    by_id = {id(t): n for n, t in list(params.items()) + list(buffers.items())}
    self._state_names = {n: by_id[id(t)] for n, t in
                         module.state_dict(keep_vars=True).items()}
    # torch modes -> names of the buffers the forward writes (found while
    # tracing), so later calls copy only those.
    self._mutated_buffers = {}
    # One forward at a time: functional_call swaps the module's tensors and
    # the train/eval flags are the module's, so concurrent calls (threads,
    # or tf.functions run from several threads) would see each other's.
    self._lock = threading.RLock()

  @property
  def torch_module(self):
    """The torch module, its parameters and buffers set to the TF values.

    The values are copied into the torch tensors each time this property is
    read, so `torch.save(m.torch_module.state_dict(), path)` saves what TF
    trained. Changes made to the torch module directly are not seen by TF:
    load them with `set_weights(m.torch_module.state_dict())`.
    """
    tensors = dict(self._torch_module.named_parameters())
    tensors.update(self._torch_module.named_buffers())
    with self._lock, torch.no_grad():
      for n, var in self._tf_variables.items():
        tensors[n].copy_(_exchange.tensor_to_torch(var.value()))
    return self._torch_module

  @tf.autograph.experimental.do_not_convert
  def __call__(self, *args, training=None, **kwargs):
    """Runs the torch module's forward on TF tensors.

    Args:
      *args: positional inputs: TF tensors or nests of them, and static
        values passed to torch as they are.
      training: None, True or False: the torch mode for this call.
      **kwargs: keyword inputs, as `args`.

    Returns:
      The forward's result with TF tensors in place of torch tensors.
    """
    if training is not None:
      training = _as_python_bool(training, self.name)
    elif not tf.executing_eagerly():
      # The traced graph depends on the mode (which buffers the forward
      # writes, hence the op's outputs), so the modes at tracing time are
      # the ones every run of this graph uses.
      training = [m.training for m in self._torch_module.modules()]
    call = _function.bind_arguments(self.name, (args, kwargs))
    if not tf.executing_eagerly():
      _function.check_not_xla(self.name)
    names = self._param_names + self._buffer_names
    vars_tf = [self._tf_variables[n].value() for n in names]
    n_params, n_vars = len(self._param_names), len(names)
    mode_key = self._mode_key(training)
    # (buffer name, torch tensor written by the forward), per thread: a
    # traced function may run in several threads at once.
    written = threading.local()

    def run(args_torch):
      with self._lock:
        return locked_run(args_torch)

    def locked_run(args_torch):
      known_mutated = self._mutated_buffers.get(mode_key)
      buffers_torch = {}
      for n, b in zip(self._buffer_names, args_torch[n_params:n_vars]):
        if b.is_meta and b.dim() == 0:
          # Finding the output shapes on meta tensors while tracing: scalar
          # buffers (counters such as BatchNorm's num_batches_tracked, which
          # its forward reads with `.item()`) get their current value, on
          # the CPU, where torch lets 0-d tensors mix with any device.
          with tf.init_scope():
            b = _exchange.tensor_to_torch(self._tf_variables[n].value()).cpu()
        # Buffers the forward may write get a private copy, so torch never
        # writes into a TF buffer behind TF's back; the copy is then
        # assigned to the variable (which adopts it without copying).
        if known_mutated is None or n in known_mutated:
          b = b.clone()
        buffers_torch[n] = b
      tensors = dict(zip(self._param_names, args_torch[:n_params]))
      tensors.update(buffers_torch)
      a, kw = call.substitute(args_torch[n_vars:])
      with _torch_mode(self._torch_module, training):
        if known_mutated is None:
          # The first call in this mode (eagerly, or on meta tensors while
          # tracing) finds the buffers the forward writes; later calls in
          # this mode copy and write back exactly those.
          versions = {n: b._version for n, b in buffers_torch.items()}
          with _WriteRecorder() as recorder:
            result = functional_call(self._torch_module, tensors, a, kw)
          known_mutated = frozenset(
              n for n, b in buffers_torch.items()
              if b._version != versions[n] or recorder.wrote(b))
        else:
          result = functional_call(self._torch_module, tensors, a, kw)
      written.items = [(n, b) for n, b in buffers_torch.items()
                       if n in known_mutated]
      return result

    def extra(args_torch, result):
      del args_torch, result
      return [b for _, b in written.items]

    differentiable = (
        [self._tf_variables[n].trainable for n in self._param_names] +
        [False] * len(self._buffer_names) +
        [_bridge.is_differentiable(a.dtype) for a in call.args_tf])
    result, written_tf = _function.call_bridged(
        run, vars_tf + call.args_tf, self.name, extra=extra,
        differentiable=differentiable)
    self._mutated_buffers[mode_key] = frozenset(n for n, _ in written.items)
    for (n, _), value_tf in zip(written.items, written_tf):
      self._tf_variables[n].assign(value_tf)
    return result

  def _mode_key(self, training):
    if isinstance(training, bool):
      return str(training)
    if training is None:
      training = [m.training for m in self._torch_module.modules()]
    return "".join("1" if t else "0" for t in training)

  def get_weights(self):
    """The state as `{torch state_dict name: np.ndarray}`.

    The arrays are copies: later training does not change them. Tied
    parameters appear under each of their state_dict names.

    Example:
      >>> import torch, torchbridge as tb
      >>> sorted(tb.TorchModule(torch.nn.Linear(3, 2)).get_weights())
      ['bias', 'weight']
    """
    return {n: np.array(self._tf_variables[c].numpy(), copy=True)
            for n, c in self._state_names.items()}

  def set_weights(self, weights):
    """Sets the state from `{torch state_dict name: array}`.

    Accepts the form `get_weights()` returns, and also torch tensors or TF
    tensors as values, so a torch `state_dict` (or `torch.load` of one)
    loads directly. Strict: every state_dict name must be present, no other
    name may be, and each shape must match; nothing changes unless all
    entries are valid.

    Args:
      weights: a mapping from state_dict names to arrays or tensors.

    Raises:
      TypeError: `weights` is not a mapping, or a value is not numeric.
      ValueError: missing, unexpected or mis-shaped entries (all named).
    """
    if not isinstance(weights, collections.abc.Mapping):
      raise TypeError(
          f"{self.name}.set_weights() expects a mapping from torch "
          f"state_dict names to arrays, got {type(weights).__name__}. Pass "
          "the dict that get_weights() returns, or a torch state_dict.")
    expected = set(self._state_names)
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
      var = self._tf_variables[self._state_names[n]]
      value = _as_numpy(weights[n], n, self.name)
      if tuple(value.shape) != tuple(var.shape):
        problems.append(
            f"{n!r} has shape {tuple(value.shape)}, expected "
            f"{tuple(var.shape)}")
        continue
      canonical = self._state_names[n]
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
      var = self._tf_variables[canonical]
      value_tf = tf.constant(value.astype(var.dtype.as_numpy_dtype))
      var.assign(_tf_owned(value_tf))


def _variable_like(tensor_torch, name, trainable):
  """A TF variable holding a TF-owned copy of a torch tensor's value."""
  with torch.no_grad():
    value_torch = tensor_torch.detach().clone(memory_format=torch.contiguous_format)
  device = "/GPU:%d" % value_torch.device.index if value_torch.is_cuda else "/CPU:0"
  with tf.device(device):
    return tf.Variable(_tf_owned(_exchange.tensor_to_tf(value_torch)),
                       name=name, trainable=trainable)


def _tf_owned(value_tf):
  """A copy of `value_tf` in a buffer that TF allocated.

  A variable whose buffer came from DLPack or numpy cannot be updated in
  place: TF copies it on the first optimizer step. Starting from a
  TF-allocated buffer keeps every update in place.
  """
  try:
    return tf.raw_ops.DeepCopy(x=value_tf)
  except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError):
    return value_tf  # no kernel for this dtype and device: TF copies once


def _check_materialized(module, name):
  for n, t in list(module.named_parameters()) + list(module.named_buffers()):
    if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
      raise ValueError(
          f"TorchModule {name!r}: torch parameter or buffer {n!r} is not "
          "initialized yet (a lazy module such as nn.LazyLinear). Run the "
          "torch module once on an example input before wrapping it, e.g. "
          "`module(torch.zeros(1, in_features))`.")
    if t.is_meta:
      raise ValueError(
          f"TorchModule {name!r}: torch parameter or buffer {n!r} is on the "
          "meta device and holds no values. Materialize it first, e.g. "
          "`module.to_empty(device='cpu')` and initialize or load weights.")


# Ops that write a batch norm's running statistics (arguments 3 and 4) when
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


class _torch_mode:
  """Sets train/eval mode on a torch module for one call, then restores it.

  `training` is None (leave the modes), a bool (for every submodule), or a
  list of bools, one per `module.modules()`.
  """

  def __init__(self, module, training):
    self._module = module
    self._training = training
    self._saved = None

  def __enter__(self):
    if self._training is not None:
      self._saved = [(m, m.training) for m in self._module.modules()]
      if isinstance(self._training, bool):
        self._module.train(self._training)
      else:
        for m, mode in zip(self._module.modules(), self._training):
          m.training = mode

  def __exit__(self, *exc_info):
    if self._saved is not None:
      for m, mode in self._saved:
        m.training = mode


def _as_python_bool(training, name):
  if isinstance(training, (bool, np.bool_)):
    return bool(training)
  if isinstance(training, (tf.Tensor, tf.Variable)) and tf.executing_eagerly() \
      and training.dtype == tf.bool and training.shape.rank == 0:
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


def _snake_case(class_name):
  # As Keras does: "BatchNorm1d" -> "batch_norm1d", "LSTM" -> "lstm",
  # "BNNet" -> "bn_net".
  name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", class_name)
  name = re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()
  return re.sub(r"\W", "_", name) or "torch_module"
