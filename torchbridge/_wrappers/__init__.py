"""Public wrappers: `torch_function`, `TorchModule`, Keras' `TorchLayer`.

Knows the user's torch code and arguments; each wrapper is an adapter that
binds a call's arguments and hands one forward to `_call` (a module's own
state goes through `_state`). Keras is imported by `_keras_layer.py` only.

May import: _runners, _state, _call, _native, _crossing, _runtime, _frameworks.
"""
