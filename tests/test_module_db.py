"""torch's own `module_db` samples through `tb.TorchModule` (see
`_module_db_cases.py`): float32 and float64, train and eval, eager and
`tf.function`, with and without a tape, against pure torch.

A module passes when every case matches; a module in `KNOWN_FAILURES` must
fail, and only in the way listed there (the README's table states why).
"""

import re

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal needs it

import os  # noqa: E402  pylint: disable=wrong-import-position

if os.environ.get("TORCHBRIDGE_DISABLE_NATIVE", "").strip() not in ("", "0"):
  # ~10 minutes a pass here; the bridge's Python is the same on both paths,
  # and the tf.py_function path has its own tests.
  pytest.skip("module_db runs with the native op (make test-long)", allow_module_level=True)

import _module_db_cases as cases  # noqa: E402  pylint: disable=wrong-import-position

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not. The
# bridge's own conformance: graph calls on the torch runner (the default
# runner's module_db tally is test_runner_coverage.py's).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("bridge_runner")]


@pytest.mark.parametrize("name", sorted(cases.MODULES))
def test_module_db_sample_matches_pure_torch(name):
  # A module listed as failing runs every sample: the failing ones may be
  # few (nn.CTCLoss: some of its 40), and a spread could miss them all.
  spread_to = None if name in cases.KNOWN_FAILURES else cases.SPREAD_TO
  results = cases.run_module(name, spread_to=spread_to)
  if not results:
    pytest.skip(f"module_db gives no forward samples for {name}")
  failures = {
    case: why
    for case, why in results.items()
    if why is not None and not why.startswith("(pure torch")
  }
  known = cases.KNOWN_FAILURES.get(name)
  if known is None:
    assert not failures, "\n".join(f"{k}: {v}" for k, v in sorted(failures.items()))
    return
  pattern, reason = known
  assert failures, f"{name} passes every case now; take it out of KNOWN_FAILURES ({reason})"
  unexpected = {k: v for k, v in failures.items() if not re.search(pattern, v)}
  assert not unexpected, "\n".join(f"{k}: {v}" for k, v in sorted(unexpected.items()))
