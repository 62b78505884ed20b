"""torch's `module_db` through the default `tb.TorchModule` inside
`tf.function`, in inference and training: every module either runs as its
TF translation and matches torch (outputs and gradients, compared here
independently of the capture's own check) or takes torch with a reason;
and through `run="torch"`: from C++ matching torch, or on the Python path
with a reason.
The committed tally (benchmarks/results/runner_coverage.md) comes from the
same code (`benchmarks/runner_coverage.py`)."""

import os

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal needs it

if os.environ.get("TORCHBRIDGE_DISABLE_NATIVE", "").strip() not in ("", "0"):
  # The TF runner does not use the native op; one pass is enough.
  pytest.skip("runs with the native op (make test-long)", allow_module_level=True)

import torch  # noqa: E402

from benchmarks import runner_coverage  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", sorted(runner_coverage.db_cases.MODULES))
def test_module_db_default_runner_matches_torch_or_falls_back(name, training):
  info = runner_coverage.db_cases.MODULES[name]
  found = runner_coverage.db_cases.samples(info, torch.float32, training)
  if not found:
    pytest.skip(f"module_db gives no float32 sample for {name}")
  module_name = f"cov_{name.replace('.', '_')}_{int(training)}"
  record = runner_coverage.run_sample(info, found[0], training, module_name)
  assert record["outcome"] in ("tf, matches", "torch", "n/a"), record
  if record["outcome"] == "torch":
    assert record["detail"], "a fallback names its reason"
    if record.get("path") == "Python":
      assert record["path_reason"], "the Python path names its reason"


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", sorted(runner_coverage.db_cases.MODULES))
def test_module_db_torch_runner_matches_torch_or_takes_the_python_path(name, training):
  # run="torch": the C++ torch runner (compared here with torch
  # independently of its own check), or the Python path with its reason.
  info = runner_coverage.db_cases.MODULES[name]
  found = runner_coverage.db_cases.samples(info, torch.float32, training)
  if not found:
    pytest.skip(f"module_db gives no float32 sample for {name}")
  module_name = f"cov_torch_{name.replace('.', '_')}_{int(training)}"
  record = runner_coverage.run_sample(info, found[0], training, module_name, run="torch")
  assert record["outcome"] in ("torch", "n/a"), record
  if record["outcome"] == "torch" and record.get("path") == "Python":
    assert record["path_reason"], "the Python path names its reason"
