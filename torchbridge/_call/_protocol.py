"""The call protocol: the one callable the core runs, and what it returns.

Every bridged call, a `torch_function`, a `TorchModule`, a Keras
`TorchLayer` or a backward, reaches the core (`_bridge.call`) as one
`Forward`: given zero-copy torch views of the call's TF arguments, it runs
the torch computation and returns a `_saved.Saved` record of its flat
outputs. The wrappers are adapters: `_call_bridged.call_bridged` turns a
wrapper's `run(args_torch) -> result` (a nest of torch tensors, or an
`Outputs`) into a `Forward`, so a new wrapper binds its arguments
(`_arguments.bind_arguments`) and calls `call_bridged`, in its own file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any, Protocol

import torch

from torchbridge._call import _saved


class Forward(Protocol):
  """`forward(args_torch, /, *, record, unused=None) -> Saved`.

  Args:
    args_torch: zero-copy torch views of the call's TF arguments.
    record: whether a gradient may follow; then the arguments that get
      gradients are made torch leaves that require grad and the autograd
      graph is recorded (the record's `has_graph`).
    unused: in an inference call inside a graph, the indices of the op's
      outputs that nothing consumes (output k + 1 is the forward's output
      k); the forward may return None for those. None: not known.

  Returns:
    A `_saved.Saved` record: the flat torch outputs, and with `record` the
      leaves and the graph a backward needs.
  """

  def __call__(
    self, args_torch: list[torch.Tensor], /, *, record: bool, unused: Collection[int] | None = None
  ) -> _saved.Saved: ...


@dataclasses.dataclass
class Outputs:
  """What a bridged forward may return besides a plain result.

  `result` is the user's result (a nest of torch tensors, numbers, None);
  `extra` maps names to torch tensors that cross as further outputs, outside
  the result (a module's buffers that the forward wrote). The names must be
  the same on every run of one call site (they are learnt on the first).
  `call_bridged` returns an `Outputs` of TF tensors for it.
  """

  result: Any
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)
