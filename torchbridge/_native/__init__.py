"""The native op: the `TorchbridgeCall` TF op built from `csrc/`.

Knows the op: building and caching its library (`_build`), loading it and
the callback registry (`_loader`), emitting the op (`_op`). Without it the
package works on the `tf.py_function` path. Never imports Keras or Ray.

May import: _crossing, _runtime, _frameworks.
"""
