"""Crossing: one tensor between TF and torch, through DLPack.

Knows one tensor: `to_torch` / `to_tf`, when TF can adopt a torch buffer as
it is (alignment, dtypes) and else one counted copy, and the counts
(`exchange_stats`). Never imports Keras or Ray.

May import: _runtime, _frameworks.
"""
