"""What the bridge costs, measured against every alternative.

Each training step is timed in processes of its own (one contender each).

Run `make bench` (or `python -m benchmarks`); `make bench QUICK=1` (or
`python -m benchmarks --quick`) is the smoke run of about a minute.
"""
