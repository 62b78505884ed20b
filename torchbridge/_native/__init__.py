"""The native op: the `TorchbridgeCall` TF op built from `csrc/`.

Knows the op: building and caching its library (`_build`), loading it and
the callback registry (`_loader`), emitting the op (`_op`); and the two
libraries beside it, each built on first use (`_side_library`): the C++
torch runner's (`_exported`) and the XLA custom call's (`_xla`). Without
the op the package works on the `tf.py_function` path. Never imports
Keras or Ray.

May import: _crossing, _runtime, _frameworks.
"""
