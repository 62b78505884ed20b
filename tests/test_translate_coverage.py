"""`benchmarks/translate_coverage.py` on a few module_db modules: the
records it builds for the README's coverage table say what translates,
what is missing and why."""

import functools

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal needs it

from benchmarks import translate_coverage as coverage  # noqa: E402  pylint: disable=wrong-import-position

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
pytestmark = [pytest.mark.slow, pytest.mark.one_pass]


@functools.cache
def _record(name, limit):
  return coverage.run_module(name, limit=limit)


def test_linear_translates_and_matches_on_every_sample():
  record = _record("nn.Linear", 3)
  assert record["module"] == "nn.Linear"
  assert record["samples_tried"] == 3
  assert record["status"] == "all", record["samples"]
  assert record["matched"] == 3
  assert record["missing_ops"] == []
  assert all(s["outcome"] == "match" for s in record["samples"])
  # Batched samples keep a dynamic batch; the sample with a keyword
  # argument goes through the `Bound` wrapper.
  assert record["dynamic_batch"] >= 1
  assert any(s.get("bound") for s in record["samples"])


def test_bilinear_reports_its_missing_op():
  record = _record("nn.Bilinear", 2)
  assert record["status"] == "none"
  assert record["matched"] == 0
  assert record["missing_ops"] == ["aten._trilinear.default"]
  for sample in record["samples"]:
    assert sample["outcome"] == "untranslated"
    assert sample["ops"] == ["aten._trilinear.default"]


def test_torch_export_refusal_is_its_own_kind():
  record = coverage.run_module("nn.CTCLoss", limit=1)
  (sample,) = record["samples"]
  assert sample["outcome"] == "export"
  assert "ctc_loss" in sample["detail"]
  assert record["status"] == "none"


def test_markdown_lists_failures_and_missing_ops():
  records = [_record("nn.Linear", 3), _record("nn.Bilinear", 2)]
  text = coverage.markdown(
    {
      "torch": "t",
      "tensorflow": "f",
      "transformers": None,
      "seconds": 1.0,
      "samples_per_module": 3,
      "module_db": records,
      "transformers_models": [],
    }
  )
  assert "**1 translate and match on every sample**, 0 on some, 1 on none" in text
  assert (
    "| `nn.Bilinear` | 0 / 2 | untranslated: `aten._trilinear.default` (samples 0, 1) |" in text
  )
  assert "| `aten._trilinear.default` | 1 | `nn.Bilinear` |" in text
  assert "Translate and match on every sample: `nn.Linear`." in text


def test_untranslated_ops_come_from_the_errors_op_list():
  err = coverage.tb.UntranslatedOpsError(
    "...",
    {
      "aten.a.default": "no TensorFlow translation",
      "aten.lstm.input (node 'lstm')": "an LSTM with proj_size",
    },
  )
  assert coverage.untranslated_ops(err) == [
    "aten.a.default",
    "refused: aten.lstm.input: an LSTM with proj_size",
  ]


def test_a_crashing_op_translation_is_an_error_not_a_missing_op():
  err = RuntimeError(
    "translate('m'): the translation of an op raised on this model:\n"
    "  aten._softmax.default (node '_softmax'): its translation raised "
    "InvalidArgumentError: bad dim\nThis is a bug ..."
  )
  kind, detail, ops = coverage.classify(err)
  assert (kind, ops) == ("error", [])
  assert detail.startswith("aten._softmax.default (node '_softmax'): its")
