"""Framework internals: every private TF, Keras and torch API, behind a
feature test (`_compat`), torch.compile's hooks (`_compiled`) and the import
order (`_load_order`: triton's library before TensorFlow).

Stands on the ground: imports no other layer.

May import: nothing.
"""
