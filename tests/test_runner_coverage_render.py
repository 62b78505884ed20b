"""The runner coverage table's rendering of its committed records
(`benchmarks/runner_coverage.py --render`): reasons recorded before the
runners' present wording are shown in it, derived from the error the
record holds, and a record cut short says so."""

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal needs it

# pylint: disable=wrong-import-position
from benchmarks import runner_coverage  # noqa: E402

# Rendering only: no bridged call.
pytestmark = pytest.mark.one_pass

_SIGNATURE = "[TensorSpec(shape=(50, 3, 15), dtype=tf.float32, name=None)]"


def test_an_old_export_refusal_reads_as_the_runner_says_it_today():
  old = (
    f"translate('m16_0'): torch.export could not export the module with input_signature "
    f"{_SIGNATURE}: DynamicOutputShapeException: aten._ctc_loss.default Fixed sizes in "
    "place of None, or example_inputs..."
  )
  assert runner_coverage._reason(old) == (
    "torch.export could not capture the forward: DynamicOutputShapeException: "
    "aten._ctc_loss.default"
  )


def test_a_data_dependent_error_cut_short_is_said_from_its_type():
  old = (
    f"torch.export could not export the module with input_signature {_SIGNATURE}: "
    "GuardOnDataDependentSymNode: Could not guard on ..."
  )
  said = runner_coverage._reason(old)
  assert said.startswith("torch.export could not capture the forward: the code depends on")
  assert "input_signature" not in said and "example_inputs" not in said


def test_a_record_cut_inside_the_error_type_says_it_predates_the_wording():
  old = f"torch.export could not export the module with input_signature {_SIGNATURE}: Guar..."
  assert runner_coverage._reason(old) == (
    "torch.export could not capture the forward (this record is older than today's "
    "wording and cut torch's error short)"
  )


def test_other_reasons_and_model_names_are_kept_or_named():
  assert runner_coverage._reason("an op has no TF translation: aten.x") == (
    "an op has no TF translation: aten.x"
  )
  assert runner_coverage._MODEL_NAMES["gpt2"] == "GPT-2"
