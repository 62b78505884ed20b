"""What the bridge costs, measured side by side with every alternative.

Run `make bench` (or `python -m benchmarks`); `make bench QUICK=1` (or
`python -m benchmarks --quick`) is the under-a-minute smoke run.
"""
