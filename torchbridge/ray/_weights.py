"""A `TorchModule`'s weights, by torch name, to and from Ray actors.

Ray's pattern for TF models: build the model once in each actor, and ship
only its weights, a dict of numpy arrays. Here the dict is the one
`TorchModule.get_weights()` returns, keyed by torch state_dict names, so it
also loads into a plain torch module (`load_state_dict`) on the other side.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Sequence
from typing import Any

import numpy as np

from torchbridge.ray._ray import ray

_NOT_A_WORKER = """\
{fn}: {which} is a {received}, which has no `{method}` method.
Expected a Ray actor handle whose class has `{method}`: wrap
tb.ray.TorchModuleWorker, or a subclass of it, with ray.remote:
  Worker = ray.remote(tb.ray.TorchModuleWorker)
  actors = [Worker.remote(module_fn) for _ in range(2)]"""


def put_weights(module: Any) -> ray.ObjectRef:
  """Puts a module's weights into Ray's object store, once.

  Pass the reference it returns to any number of actor calls: Ray resolves
  an `ObjectRef` given as a top-level argument before the call, and actors
  on the driver's node read the arrays from shared memory without a copy
  (as read-only arrays).

  Args:
    module: a `tb.TorchModule` (or anything with `get_weights()`), or a
      mapping `{torch state_dict name: array}`.

  Returns:
    A reference to the weights, `{torch state_dict name: np.ndarray}`, in
      the object store.

  Raises:
    TypeError: `module` is neither a mapping nor has `get_weights()`.

  Examples:
    >>> import torch, ray, torchbridge as tb
    >>> ref = tb.ray.put_weights(tb.TorchModule(torch.nn.Linear(3, 2)))
    >>> sorted(ray.get(ref))
    ['bias', 'weight']
  """
  return ray.put(_weights_np(module, "put_weights(module)"))


def broadcast_weights(module: Any, actors: Sequence[Any]) -> list[ray.ObjectRef]:
  """Sends a module's weights to every actor, with one `ray.put`.

  The weights go into the object store once, and every actor's
  `set_weights` gets the same `ObjectRef`: the cost of a broadcast grows
  with the number of actors only by one small call each, not by one copy
  of the weights each. `ray.get` of the result waits until every actor
  holds the weights (and raises what an actor raised); calls made to an
  actor after this one run after it, so there is no need to wait before
  using the actors.

  Args:
    module: a `tb.TorchModule` (or anything with `get_weights()`), or a
      mapping `{torch state_dict name: array}`.
    actors: Ray actor handles whose class has `set_weights(weights)`, such
      as `ray.remote(tb.ray.TorchModuleWorker)` actors.

  Returns:
    The references to the results of the `set_weights` calls, one per
      actor, in the order of `actors` (an empty list for no actors).

  Raises:
    TypeError: an actor has no `set_weights` method, or `module` is neither
      a mapping nor has `get_weights()`.

  Examples:
    >>> import torch, ray, torchbridge as tb
    >>> Worker = ray.remote(tb.ray.TorchModuleWorker)
    >>> actors = [Worker.remote(lambda: torch.nn.Linear(3, 2)) for _ in range(2)]
    >>> learner = tb.TorchModule(torch.nn.Linear(3, 2))
    >>> ray.get(tb.ray.broadcast_weights(learner, actors))
    [None, None]
  """
  actors = list(actors)
  for index, actor in enumerate(actors):
    _check_actor(actor, index, "set_weights", "broadcast_weights()")
  if not actors:
    return []
  weights_ref = put_weights(module)
  return [actor.set_weights.remote(weights_ref) for actor in actors]


def pull_weights(actor: Any, module: Any = None) -> dict[str, np.ndarray]:
  """Fetches the weights an actor holds, and loads them into `module`.

  Args:
    actor: a Ray actor handle whose class has `get_weights()`, such as a
      `ray.remote(tb.ray.TorchModuleWorker)` actor.
    module: optional `tb.TorchModule` on the caller's side; when given, its
      `set_weights` receives the actor's weights (strict, all or nothing).

  Returns:
    The actor's weights, `{torch state_dict name: np.ndarray}`.

  Raises:
    TypeError: `actor` has no `get_weights` method.
    ValueError: `module`'s `set_weights` refused the weights (missing,
      unexpected or mis-shaped entries, all named).

  Examples:
    >>> import torch, ray, torchbridge as tb
    >>> actor = ray.remote(tb.ray.TorchModuleWorker).remote(
    ...     lambda: torch.nn.Linear(3, 2))
    >>> local = tb.TorchModule(torch.nn.Linear(3, 2))
    >>> sorted(tb.ray.pull_weights(actor, local))
    ['bias', 'weight']
  """
  _check_actor(actor, None, "get_weights", "pull_weights()")
  weights_np = ray.get(actor.get_weights.remote())
  if module is not None:
    module.set_weights(weights_np)
  return weights_np


def resolve_weights(weights: Any) -> Any:
  """`weights`, fetched first when it is an `ObjectRef` to them."""
  if isinstance(weights, ray.ObjectRef):
    return ray.get(weights)
  return weights


def _weights_np(module: Any, where: str) -> dict[str, Any]:
  if isinstance(module, collections.abc.Mapping):
    return dict(module)
  if callable(getattr(module, "get_weights", None)):
    return module.get_weights()
  raise TypeError(
    f"{where} expects a tb.TorchModule (anything with get_weights()) or a "
    f"mapping {{torch state_dict name: array}}, got "
    f"{type(module).__name__}. Pass the TorchModule whose weights the "
    "actors should hold."
  )


def _check_actor(actor: Any, index: int | None, method: str, fn: str) -> None:
  if hasattr(actor, method):
    return
  which = "actor" if index is None else f"actors[{index}]"
  raise TypeError(
    _NOT_A_WORKER.format(fn=fn, which=which, received=type(actor).__name__, method=method)
  )
