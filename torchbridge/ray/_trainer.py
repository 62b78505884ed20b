"""`DataParallelTrainer`: Ray actors compute gradients, the driver applies them."""

from __future__ import annotations

import collections.abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch  # first, the recommended order: docs/troubleshooting.md, "Does the import order matter?"
import tensorflow as tf

from torchbridge._wrappers import _module
from torchbridge.ray import _gradients
from torchbridge.ray import _weights
from torchbridge.ray import _worker
from torchbridge.ray._ray import ray

_NO_SHARDS = """\
DataParallelTrainer{where} expects a non-empty list with one {kind} of
data per worker, got {received}. A shard is a tuple of arrays with the same
number of samples (rows), passed to loss_fn(module, *shard). To split one
data set over 2 workers:
  shards = list(zip(np.array_split(x, 2), np.array_split(y, 2)))"""

_WORKER_FAILED = """\
DataParallelTrainer: worker {index} of {count} failed in {method}(): \
{message}
The worker's traceback is in the exception this one was raised from. \
{consequence}"""

_CONSEQUENCE = {
  "compute_gradients": (
    "Nothing was applied: the driver's module and optimizer are as they were before this step."
  ),
  "set_weights": (
    "The driver's module holds the weights that were being sent; this worker may not."
  ),
}


class _DataParallelWorker(_worker.TorchModuleWorker):
  """A `TorchModuleWorker` holding a shard of data and a loss function."""

  def __init__(
    self,
    module_fn: Callable[[], torch.nn.Module],
    loss_fn: Callable[..., Any],
    shard_np: Sequence[np.ndarray],
    name: str | None,
    tf_function: bool,
  ) -> None:
    super().__init__(module_fn, name=name)
    self._shard_tf = tuple(tf.constant(a) for a in shard_np)
    self._num_samples = _num_samples(shard_np)
    self._gradients = _gradients.Gradients(self.module, loss_fn, tf_function)
    self._buffers = _gradients.named_buffers(self.module, self.module.torch_module)

  def compute_gradients(self, batch_np: Sequence[np.ndarray] | None = None) -> dict[str, Any]:
    """`{"loss", "num_samples", "grads", "buffers"}` on the held shard or on
    `batch_np`; "buffers" holds the buffers' values after the forward."""
    if batch_np is None:
      batch_tf, num_samples = self._shard_tf, self._num_samples
    else:
      batch_tf = tuple(tf.constant(a) for a in batch_np)
      num_samples = _num_samples(batch_np)
    loss, grads_np = self._gradients(batch_tf)
    buffers_np = {n: v.numpy() for n, v in self._buffers}
    return {"loss": loss, "num_samples": num_samples, "grads": grads_np, "buffers": buffers_np}


class DataParallelTrainer:
  """Data-parallel training of a torch module on Ray actors, TF optimizer.

  The pattern of Ray's "train in parallel using gradients" guide, with the
  driver as the parameter server: each worker (a Ray actor) builds the
  torch module from `module_fn` as a `tb.TorchModule`, holds one shard of
  the data, and computes the gradients of `loss_fn` on it (forward and
  backward in one `tf.function`). Each `step()`:

  1. every worker computes `{torch name: gradient}` on its shard, in
     parallel;
  2. the driver averages them weighted by the shards' sample counts, so
     that the result is the gradient of the mean loss over all shards
     together (exactly what one process would compute on the
     concatenated batch, when `loss_fn` is a mean over samples);
  3. the driver applies `optimizer` to its own `TorchModule`
     (`self.module`), so optimizer state lives in one place and
     `tf.train.Checkpoint(module=trainer.module, opt=trainer.optimizer)`
     saves the run;
  4. buffers the workers' forwards wrote (BatchNorm running statistics)
     are averaged the same way into the driver's module;
  5. the new weights go to every worker with one `ray.put`
     (`tb.ray.broadcast_weights`).

  The workers start from the driver's weights, whatever `module_fn`'s
  random initialization gave each of them. Each worker's forward sees only
  its shard: BatchNorm normalizes with per-shard batch statistics (as
  unsynchronized BatchNorm does under tf.distribute).

  Each worker reserves `worker_options["num_cpus"]` Ray CPUs (1 by
  default); workers that do not fit wait, as any Ray actor, for CPUs to
  free up.

  Args:
    module_fn: picklable callable returning the torch `nn.Module`, called
      once on the driver and once in each worker.
    loss_fn: `loss_fn(module, *batch_tf)` -> scalar TF loss, the mean over
      the batch; `module` is the `tb.TorchModule`, `batch_tf` the shard's
      arrays as TF tensors. Picklable (a function at the top of a module or
      script).
    optimizer: a TF optimizer (`tf.keras.optimizers.Adam(1e-3)`, any
      object with `apply_gradients`), applied on the driver.
    shards: one shard per worker; a shard is a tuple of arrays (numpy, or
      tensors numpy can read) with the same leading (sample) dimension, or
      one array.
    num_workers: optional; when given it must equal `len(shards)`.
    name: the `TorchModule`s' name.
    worker_options: options for the worker actors
      (`ray.remote(...).options(**worker_options)`); defaults to
      `{"num_cpus": 1}`.
    tf_function: compute the workers' gradients in a `tf.function` (the
      default); False computes them eagerly, for a loss that cannot be
      traced.

  Attributes:
    module (tb.TorchModule): the driver's module, which holds the trained
      weights.
    optimizer (Any): the optimizer, as given.
    workers (list): the Ray actor handles, one per shard (empty after
      `shutdown()`).
    num_samples (list[int]): the number of samples of each shard.
    steps (int): the number of steps taken.

  Raises:
    TypeError: `module_fn` or `loss_fn` is not callable (or is a torch
      module), `optimizer` has no `apply_gradients`, a shard holds values
      numpy cannot read, or `module_fn()` returns no `torch.nn.Module`.
    ValueError: `shards` is empty or not a list, a shard's arrays do not
      share a non-zero leading dimension, or `num_workers` differs from
      `len(shards)`.
    RuntimeError: a worker failed to start (its error is in the message;
      the workers started are stopped).

  Examples:
    >>> import numpy as np, torch, ray, tensorflow as tf, torchbridge as tb
    >>> def loss_fn(module, x, y):
    ...   return tf.reduce_mean((module(x) - y) ** 2)
    >>> x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    >>> y = x.sum(axis=1, keepdims=True)
    >>> trainer = tb.ray.DataParallelTrainer(
    ...     lambda: torch.nn.Linear(3, 1), loss_fn,
    ...     tf.keras.optimizers.Adam(0.05),
    ...     shards=[(x[:32], y[:32]), (x[32:], y[32:])])
    >>> losses = [trainer.step() for _ in range(100)]
    >>> losses[-1] < 0.1 * losses[0]
    True
    >>> trainer.shutdown()
  """

  def __init__(
    self,
    module_fn: Callable[[], torch.nn.Module],
    loss_fn: Callable[..., Any],
    optimizer: Any,
    shards: Sequence[Any],
    *,
    num_workers: int | None = None,
    name: str | None = None,
    worker_options: Mapping[str, Any] | None = None,
    tf_function: bool = True,
  ) -> None:
    _check_callable(module_fn, "module_fn", "lambda: MyNet()")
    _check_callable(
      loss_fn, "loss_fn", "def loss_fn(module, x, y): return tf.reduce_mean((module(x) - y) ** 2)"
    )
    if not callable(getattr(optimizer, "apply_gradients", None)):
      raise TypeError(
        f"DataParallelTrainer(optimizer=...) expects a TF optimizer (an "
        f"object with apply_gradients), got {type(optimizer).__name__}. "
        "Pass e.g. tf.keras.optimizers.Adam(1e-3)."
      )
    shards_np = _check_shards(shards, "(shards=...)")
    if num_workers is not None and num_workers != len(shards_np):
      raise ValueError(
        f"DataParallelTrainer(num_workers={num_workers!r}) does not match "
        f"the {len(shards_np)} shards given: each worker holds exactly one "
        f"shard. Pass {num_workers} shards (e.g. np.array_split(x, "
        f"{num_workers})), or leave num_workers out."
      )
    module_torch = _worker.build_module(module_fn, "DataParallelTrainer(module_fn)")
    self.module = _module.TorchModule(module_torch, name=name)
    self.optimizer = optimizer
    named = _gradients.named_variables(self.module, trainable_only=True)
    self._names = [n for n, _ in named]
    self._variables = [v for _, v in named]
    self._buffers = _gradients.named_buffers(self.module, module_torch)
    self._apply_graph = tf.function(self._apply)
    self.num_samples = [_num_samples(s) for s in shards_np]
    self.steps = 0
    options = {"num_cpus": 1, **(worker_options or {})}
    remote_cls = ray.remote(_DataParallelWorker).options(**options)
    # Ray actor handles (Ray types them loosely: their methods gain .remote).
    self.workers: list[Any] = [
      remote_cls.remote(module_fn, loss_fn, shard_np, self.module.name, tf_function)
      for shard_np in shards_np
    ]
    try:
      # Every worker starts from the driver's weights; waiting for them
      # also surfaces a worker that failed to start.
      self._get_all(_weights.broadcast_weights(self.module, self.workers), "set_weights")
    except BaseException:
      self.shutdown()
      raise

  @property
  def num_workers(self) -> int:
    """The number of workers (0 after `shutdown()`)."""
    return len(self.workers)

  def step(self, batches: Sequence[Any] | None = None) -> float:
    """One synchronous data-parallel step; returns the mean loss.

    Args:
      batches: optional, one batch per worker (each in the form of a
        shard) to use for this step instead of the shards the workers hold,
        e.g. fresh samples from a data pipeline on the driver.

    Returns:
      The loss over all workers' samples before the update: the workers'
        losses weighted by their sample counts.

    Raises:
      RuntimeError: a worker failed (the message gives its exception's
        type and message, and whether the update was applied; the cause
        holds its traceback), or the trainer was shut down.
      TypeError: a batch holds values numpy cannot read.
      ValueError: `batches` does not hold one batch per worker, or a
        batch's arrays do not share a non-zero leading dimension.
    """
    if not self.workers:
      raise RuntimeError(
        "DataParallelTrainer.step() after shutdown(): the workers are "
        "gone. Create a new DataParallelTrainer."
      )
    if batches is None:
      refs = [w.compute_gradients.remote() for w in self.workers]
    else:
      batches_np = _check_shards(batches, ".step(batches=...)")
      if len(batches_np) != self.num_workers:
        raise ValueError(
          f"DataParallelTrainer.step(batches=...) got {len(batches_np)} "
          f"batches for {self.num_workers} workers. Pass one batch per "
          "worker, or no batches to use the shards the workers hold."
        )
      refs = [w.compute_gradients.remote(b) for w, b in zip(self.workers, batches_np)]
    results = self._get_all(refs, "compute_gradients")
    total = sum(r["num_samples"] for r in results)
    grads_tf = []
    for name, var in zip(self._names, self._variables):
      grad_np = sum(r["grads"][name] * (r["num_samples"] / total) for r in results)
      grads_tf.append(tf.constant(grad_np, dtype=var.dtype))
    # The first update runs eagerly: it creates the optimizer's slots, which
    # a tf.function may only do on its first trace.
    if self.steps == 0:
      self._apply(grads_tf)
    else:
      self._apply_graph(grads_tf)
    if self._buffers:
      # What the workers' forwards wrote (BatchNorm running statistics).
      buffers_np = _gradients.average_buffers(
        [r["buffers"] for r in results], [r["num_samples"] for r in results]
      )
      for name, var in self._buffers:
        var.assign(buffers_np[name])
    self.steps += 1
    self._get_all(_weights.broadcast_weights(self.module, self.workers), "set_weights")
    return sum(r["loss"] * r["num_samples"] for r in results) / total

  def shutdown(self) -> None:
    """Stops the worker actors; the driver's module and optimizer remain.

    The trainer is also a context manager that shuts down on exit:
    `with tb.ray.DataParallelTrainer(...) as trainer:`.
    """
    for worker in self.workers:
      ray.kill(worker)
    self.workers = []

  def __enter__(self) -> DataParallelTrainer:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.shutdown()

  def _apply(self, grads_tf: Sequence[tf.Tensor]) -> None:
    self.optimizer.apply_gradients(zip(grads_tf, self._variables))

  def _get_all(self, refs: Sequence[Any], method: str) -> list[Any]:
    """`ray.get` of one call per worker; a failure names its worker."""
    results = []
    for index, ref in enumerate(refs):
      try:
        results.append(ray.get(ref))
      except ray.exceptions.RayError as err:
        raise RuntimeError(
          _WORKER_FAILED.format(
            index=index,
            count=len(refs),
            method=method,
            message=_short_message(err),
            consequence=_CONSEQUENCE[method],
          )
        ) from err
    if method == "compute_gradients":
      for index, result in enumerate(results):
        if sorted(result["grads"]) != sorted(self._names):
          raise RuntimeError(
            f"DataParallelTrainer: worker {index} returned gradients for "
            f"{sorted(result['grads'])}, the driver's module has "
            f"{sorted(self._names)}. module_fn must build the same module "
            "in every process."
          )
    return results


def _check_callable(value: object, arg: str, example: str) -> None:
  # A torch module is callable too, but calling it runs its forward.
  if isinstance(value, torch.nn.Module) or not callable(value):
    raise TypeError(
      f"DataParallelTrainer({arg}=...) expects a callable, got "
      f"{type(value).__name__}. Pass a function, e.g. {example}"
    )


def _check_shards(shards: Any, where: str) -> list[tuple[np.ndarray, ...]]:
  """The shards as tuples of numpy arrays, each with a consistent length.

  `where` is the argument as the user wrote it, "(shards=...)" or
  ".step(batches=...)", for the error messages.
  """
  kind = "shard" if "shards" in where else "batch"
  is_list = isinstance(shards, collections.abc.Sequence) and not isinstance(shards, (str, bytes))
  if not is_list or not shards:
    received = f"an empty {type(shards).__name__}" if is_list else f"a {type(shards).__name__}"
    raise ValueError(_NO_SHARDS.format(where=where, kind=kind, received=received))
  shards_np = []
  for index, shard in enumerate(shards):
    arrays = shard if isinstance(shard, (tuple, list)) else (shard,)
    try:
      arrays_np = tuple(np.asarray(a) for a in arrays)
    except Exception as err:
      raise TypeError(
        f"DataParallelTrainer{where}: {kind} {index} holds a value numpy "
        f"cannot read ({err}). Expected a tuple of arrays."
      ) from err
    sizes = [a.shape[0] if a.ndim else None for a in arrays_np]
    if not arrays_np or None in sizes or len(set(sizes)) != 1 or sizes[0] == 0:
      raise ValueError(
        f"DataParallelTrainer{where}: {kind} {index} must be a tuple of "
        f"arrays sharing a non-zero leading (sample) dimension, got shapes "
        f"{[a.shape for a in arrays_np]}. Split every array of the data "
        "set along axis 0, the same way."
      )
    shards_np.append(arrays_np)
  return shards_np


def _num_samples(arrays: Sequence[Any]) -> int:
  return int(np.shape(arrays[0])[0])


def _short_message(err: BaseException) -> str:
  """The remote exception's type and message, without Ray's wrapping."""
  cause = getattr(err, "cause", None)
  if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
    return f"{type(cause).__name__}: {cause}"
  return f"{type(err).__name__}: {err}"
