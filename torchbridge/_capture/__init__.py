"""Capture: a graph call's forward captured once per call signature.

Knows captures, not which runner takes them: the key and the store of one
runner's captures (`_captures`, with the module held still while one is
made), the one `torch.export` per signature every runner lowers
(`_shared_export`), the one check of a capture against torch with the one
tolerance table (`_parity`), the Python state a capture read (`_watch`)
and the check of it before each call of a graph (`_guard`, with the
public `StaleCaptureError`). Never imports Keras or Ray.

May import: _state, _call, _native, _crossing, _runtime, _translate, _frameworks.
"""
