"""The command line: `python -m torchbridge info|build`.

Knows everything below, read-only (what `info` reports); builds through
`_native`.

May import: _runners, _native, _crossing, _runtime, _frameworks.
"""
