"""Module state: one `nn.Module`'s parameters and buffers as TF variables.

Knows one module: its variables, the views that hold its weights once, the
tensor slots swapped in for a call, the buffers a forward writes, its
train/eval mode and checks, and its calls through the bridge (the Python
path, through `_call`). Which runner a call takes is `_runners`'. Never
imports Keras or Ray.

May import: _call, _native, _crossing, _runtime, _frameworks.
"""
