"""The call: one differentiable TF op around one torch forward.

Knows flat lists of tensors, not modules: the call protocol (`_protocol`),
binding arguments, the adapter from a torch result to flat outputs
(`_function.call_bridged`), output specs, the op and its gradient, the
state kept for the backward and torch's autograd engine. Never imports
Keras or Ray, nor anything about modules (`_state`, `_wrappers`).

May import: _native, _crossing, _runtime, _frameworks.
"""
