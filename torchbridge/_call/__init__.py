"""The call: one differentiable TF op around one torch forward.

Knows flat lists of tensors, not modules: the call protocol (`_protocol`:
the one `Forward` the core runs), binding a call's arguments
(`_arguments`), the adapter from a wrapper's torch result to that protocol
(`_call_bridged`), output specs (`_signature`, `_output_check`), the op and
its gradient (`_bridge`, `_eager`, `_graph`, `_gradients`; `_exported_call`
for an exported program run from C++; `_xla_shapes` for output shapes
found when XLA compiles a call), the state kept
for the backward (`_saved`) and torch's autograd engine (`_vjp`). Never
imports Keras or Ray, nor anything about modules (`_state`, `_wrappers`).

The names below are the layer's entry: a wrapper binds its arguments and
calls `call_bridged`, and needs nothing else of this layer.

May import: _native, _crossing, _runtime, _frameworks.
"""

from torchbridge._call._arguments import bind_arguments
from torchbridge._call._arguments import check_not_xla
from torchbridge._call._arguments import check_output_signature
from torchbridge._call._call_bridged import call_bridged
from torchbridge._call._exported_call import call_exported
from torchbridge._call._gradients import is_differentiable
from torchbridge._call._protocol import Forward
from torchbridge._call._protocol import Outputs
from torchbridge._call._signature import probe_sizes
from torchbridge._call._signature import specs_of_runs
from torchbridge._call._signature import stand_in_args

__all__ = [
  "Forward",
  "Outputs",
  "bind_arguments",
  "call_bridged",
  "call_exported",
  "check_not_xla",
  "check_output_signature",
  "is_differentiable",
  "probe_sizes",
  "specs_of_runs",
  "stand_in_args",
]
