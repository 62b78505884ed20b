"""`TorchModuleWorker`: a `TorchModule` built inside a Ray actor's process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch  # first, the recommended order: docs/troubleshooting.md, "Does the import order matter?"
import numpy as np
import tensorflow as tf  # noqa: F401  (imported here, after torch, on purpose)

from torchbridge._wrappers import _module
from torchbridge.ray import _weights


class TorchModuleWorker:
  """Holds a `tb.TorchModule` built in its own process from `module_fn()`.

  The class to run as a Ray actor, as it is or subclassed (rollout workers,
  evaluators): Ray's pattern for TF models is to build the model once per
  actor and to ship only its weights, since a module is much bigger to
  pickle than its weights and may hold process-local state. The torch
  module is therefore built by `module_fn` inside the actor, and weights
  travel as `{torch state_dict name: np.ndarray}`, through
  `tb.ray.broadcast_weights` (one `ray.put` for all actors) and
  `tb.ray.pull_weights`.

  The class is plain Python and also works without Ray (for tests, or a
  local evaluator).

  Args:
    module_fn: a picklable callable, called with no arguments inside the
      actor, returning the torch `nn.Module` (a function defined at the top
      of a module or script, a class, or a `functools.partial` of one).
    name: the `TorchModule`'s name (its variables are `name/<torch path>`).

  Attributes:
    module (tb.TorchModule): the module the worker built and holds.

  Raises:
    TypeError: `module_fn` is not callable, is a torch module itself
      (pass the function or class that builds it), or returns something
      other than a `torch.nn.Module`.
    ValueError: the module built cannot be wrapped (see `tb.TorchModule`).

  Examples:
    Weights from a learner to two actors, and back:

    >>> import torch, ray, tensorflow as tf, torchbridge as tb
    >>> Worker = ray.remote(tb.ray.TorchModuleWorker)
    >>> actors = [Worker.remote(lambda: torch.nn.Linear(3, 2), name="policy")
    ...           for _ in range(2)]
    >>> learner = tb.TorchModule(torch.nn.Linear(3, 2), name="policy")
    >>> ray.get(tb.ray.broadcast_weights(learner, actors)) and None
    >>> w = tb.ray.pull_weights(actors[1])
    >>> bool((w["weight"] == learner.get_weights()["weight"]).all())
    True

    A subclass adds the work (acting in an environment, evaluating), and
    runs as an actor with `ray.remote(Evaluator)`, or here as plain Python:

    >>> class Evaluator(tb.ray.TorchModuleWorker):
    ...   def __init__(self, module_fn):
    ...     super().__init__(module_fn, name="critic")
    ...   def evaluate(self, x):  # self.module holds the latest weights
    ...     return self.module(tf.constant(x)).shape.as_list()
    >>> evaluator = Evaluator(lambda: torch.nn.Linear(3, 1))
    >>> evaluator.set_weights(tb.TorchModule(torch.nn.Linear(3, 1)).get_weights())
    >>> evaluator.evaluate([[0.0, 1.0, 2.0]])
    [1, 1]
  """

  def __init__(self, module_fn: Callable[[], torch.nn.Module], name: str | None = None) -> None:
    # A module is callable too, but calling it runs its forward.
    if isinstance(module_fn, torch.nn.Module) or not callable(module_fn):
      raise TypeError(
        f"TorchModuleWorker(module_fn) expects a callable that builds the "
        f"torch module, got {type(module_fn).__name__}. Pass the function "
        "or class, not the module: TorchModuleWorker(lambda: MyNet()), so "
        "that each actor builds its own copy."
      )
    self.module = _module.TorchModule(
      build_module(module_fn, "TorchModuleWorker(module_fn)"), name=name
    )

  def get_weights(self) -> dict[str, np.ndarray]:
    """The module's weights (`TorchModule.get_weights`).

    Returns:
      `{torch state_dict name: np.ndarray}`, copies.
    """
    return self.module.get_weights()

  def set_weights(self, weights: Any) -> None:
    """Sets the module's weights, all or nothing (`TorchModule.set_weights`).

    Args:
      weights: `{torch state_dict name: array}`, or an `ObjectRef` to it
        (from `tb.ray.put_weights`). The values are copied into the
        module's TF variables, so read-only arrays from the object store
        are fine and stay untouched.

    Raises:
      TypeError: `weights` is not a mapping, or a value is not numeric.
      ValueError: missing, unexpected or mis-shaped entries (all named).
    """
    self.module.set_weights(_weights.resolve_weights(weights))


def build_module(module_fn: Callable[[], torch.nn.Module], where: str) -> torch.nn.Module:
  """`module_fn()`, checked to be a torch module; `where` names the caller."""
  module_torch = module_fn()
  if not isinstance(module_torch, torch.nn.Module):
    raise TypeError(
      f"{where}: module_fn() returned a {type(module_torch).__name__}, "
      "expected a torch.nn.Module. Make module_fn return the module it "
      "builds."
    )
  return module_torch
