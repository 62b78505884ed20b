"""Where torch runs: threads, OpenMP teams, CUDA streams, and the timeline.

Knows threads and streams: the placement policy, the torch thread, the
user's OpenMP team, per-thread state, and the phase spans every other
layer marks (`_timeline`). Knows nothing of tensors crossing or of calls.

May import: _frameworks.
"""
