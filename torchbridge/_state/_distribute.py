"""What the bridge needs from `tf.distribute`: which strategies, which
aggregation for torch buffers, and the checks that explain misuse.

Under `MirroredStrategy` / `MultiWorkerMirroredStrategy` every replica runs
its own torch forward and backward on its shard, on views of its own copy of
the variables; TF all-reduces the gradients as it does for native variables.
Buffers the forward writes (BatchNorm statistics, counters) are assigned in
replica context, so they are made with an aggregation that keeps the copies
equal: floating buffers take the mean of the replicas' new values, other
buffers the first replica's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

# Strategies that run every replica in this process's Python (or, for the
# multi-worker one, in each worker's), so a torch call can run there.
_SUPPORTED_STRATEGIES = (
  tf.distribute.MirroredStrategy,
  tf.distribute.MultiWorkerMirroredStrategy,
  tf.distribute.OneDeviceStrategy,
  tf.compat.v1.distribute.MirroredStrategy,
  tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy,
  tf.compat.v1.distribute.OneDeviceStrategy,
)

_UNSUPPORTED = """\
{owner} cannot run under {strategy}: {reason}
torchbridge supports the default strategy, OneDeviceStrategy, MirroredStrategy
(one or more local devices) and MultiWorkerMirroredStrategy (one process per
worker), where each replica runs its torch forward and backward in the
process that holds its variables. Create the module under one of those, e.g.
  strategy = tf.distribute.MirroredStrategy()
  with strategy.scope():
    module = tb.TorchModule(torch_module)"""

_TPU_REASON = "a TPU cannot run the bridge's XLA custom call, which has a CPU kernel only."
_PARAMETER_SERVER_REASON = (
  "its functions run on remote worker processes, which cannot reach this process's torch module."
)
_REASONS = {
  "TPUStrategy": _TPU_REASON,
  "TPUStrategyV2": _TPU_REASON,
  "ParameterServerStrategy": _PARAMETER_SERVER_REASON,
  "ParameterServerStrategyV2": _PARAMETER_SERVER_REASON,
  "CentralStorageStrategy": (
    "it keeps variables on one device and aggregates updates in ways "
    "the bridge's buffer write-back does not follow (untested)."
  ),
}

_OUTSIDE_SCOPE = """\
The torch module {owner!r} was created outside `strategy.scope()` but is
called in a replica of {strategy}: its variables are not mirrored, so the
replicas would not get their own copies and TF could not all-reduce their
gradients. Create the module (and the optimizer) under the scope:
  with strategy.scope():
    module = tb.TorchModule(torch_module)
    optimizer = tf.keras.optimizers.Adam()"""


def check_strategy(owner: str) -> None:
  """Raises for a current strategy the bridge cannot run under."""
  if not tf.distribute.has_strategy():
    return
  strategy = tf.distribute.get_strategy()
  if isinstance(strategy, _SUPPORTED_STRATEGIES):
    return
  name = type(strategy).__name__
  raise ValueError(
    _UNSUPPORTED.format(
      owner=owner,
      strategy=name,
      reason=_REASONS.get(name, "it is not one the bridge was built for."),
    )
  )


def check_call_context(owner: str, variables: Iterable[Any]) -> None:
  """Raises for a call in a replica whose strategy did not make `variables`.

  Called at each call of a module: the strategy must be supported, and in a
  replica of a strategy (inside `strategy.run`) the variables must be that
  strategy's.
  """
  if not tf.distribute.has_strategy():
    return
  check_strategy(owner)
  if not in_replica_of_several():
    return  # cross-replica, or one replica: plain variables serve it as well
  strategy = tf.distribute.get_strategy()
  extended = strategy.extended
  if not all(extended.variable_created_in_scope(_tf_variable(v)) for v in variables):
    raise ValueError(_OUTSIDE_SCOPE.format(owner=owner, strategy=type(strategy).__name__))


def in_replica_of_several() -> bool:
  """Whether this call runs in one replica of a strategy with several in
  sync (inside `strategy.run`): its writes meet the other replicas' (a
  buffer's assign waits for them all), so it must not hold a lock they wait
  for."""
  if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
    return False
  return tf.distribute.get_strategy().num_replicas_in_sync > 1


def _tf_variable(variable: Any) -> tf.Variable:
  # A keras.Variable holds its tf.Variable in `.value` (on tf.Variable,
  # `value` is a method).
  if isinstance(variable, tf.Variable):
    return variable
  return variable.value


def buffer_aggregation(dtype_tf: tf.DType) -> tf.VariableAggregation:
  """How replicas combine their writes to a torch buffer of this dtype."""
  if tf.as_dtype(dtype_tf).is_floating:
    return tf.VariableAggregation.MEAN
  return tf.VariableAggregation.ONLY_FIRST_REPLICA
