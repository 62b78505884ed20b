"""A refusal reads as one sentence: when torch.export cannot capture a
module (the packed LSTM of examples/ppo), each runner says so in one line
at INFO / WARNING naming the module, the runner it took and the reason
(where in the user's code); torch's whole error is at DEBUG on the same
logger, in `tb.timeline()`'s runner record and in `info`'s report; nothing
torch prints (its partial FX graph) reaches the terminal."""

import gc
import logging
import os
import sys

import pytest
import torch
import tensorflow as tf

import torchbridge as tb
from torchbridge._cli import _report
from torchbridge._translate import _export_errors

# The runners' own refusals (the TF runner's, the C++ torch runner's): with
# the native op, so in the native pass only.
pytestmark = pytest.mark.one_pass

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from ppo import networks  # noqa: E402


@pytest.fixture(autouse=True)
def _collect_wrappers():
  yield
  gc.collect()


def _lstm_call(run, name):
  torch.manual_seed(0)
  module = tb.TorchModule(networks.RecurrentActorCritic(2, 2), name=name, run=run)
  state = tf.TensorSpec([1, None, networks.HIDDEN], tf.float32)
  call = tf.function(
    lambda obs, lens, s: module(obs, lens, s),
    input_signature=[
      tf.TensorSpec([None, 1, 2], tf.float32),
      tf.TensorSpec([None], tf.int64),
      ((state, state), (state, state)),
    ],
  )
  zeros = tf.zeros([1, 4, networks.HIDDEN])
  return call, (tf.zeros([4, 1, 2]), tf.ones([4], tf.int64), ((zeros, zeros), (zeros, zeros)))


@pytest.mark.parametrize("run", ["auto", "torch"])
def test_an_export_refusal_is_one_line_with_torchs_error_at_debug(run, caplog, capfd):
  name = f"lstm_{run}"
  call, args = _lstm_call(run, name)
  with caplog.at_level(logging.DEBUG, logger="torchbridge"), tb.timeline() as trace:
    call(*args)
    call(*args)  # said once
  said = [r for r in caplog.records if r.levelno >= logging.INFO and name in r.getMessage()]
  runner_lines = [r.getMessage() for r in said if "graph calls run torch" in r.getMessage()]
  assert runner_lines, [r.getMessage() for r in said]
  for line in runner_lines:
    assert "\n" not in line and len(line) < 400, line
    assert "depends on tensor values" in line, line
    assert "(networks.py:" in line, line  # where in the user's code
  assert len(runner_lines) == len(set(runner_lines))  # each said once
  debug = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
  assert "Could not" in debug and "data-dependent" in debug  # torch's own words
  assert "torch.export printed:" in debug and "def forward" in debug  # its partial graph
  # Nothing of torch's reached the terminal.
  out, err = capfd.readouterr()
  assert "def forward" not in out + err and "TORCHDYNAMO" not in out + err

  record = trace.runners[name]
  reason = record.get("path_reason") or record["reason"]
  assert "\n" not in reason and "depends on tensor values" in reason
  assert "Could not" in record["detail"]
  report = _report.report()["runners"]
  assert "\n" not in report["modules"][name]
  assert "Could not" in report["details"][name]


def test_run_tf_raises_one_sentence_and_logs_the_detail(caplog):
  call, args = _lstm_call("tf", "lstm_tf")
  with caplog.at_level(logging.DEBUG, logger="torchbridge"):
    with pytest.raises(ValueError, match="depends on tensor values") as raised:
      call(*args)
  assert "TORCHDYNAMO" not in str(raised.value) and "def forward" not in str(raised.value)
  assert any("Could not" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


class _Branchy(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(3, 3)

  def forward(self, x):
    if x.sum() > 0:  # a branch on the data: torch.export cannot hold it
      return self.lin(x)
    return x


def test_translate_names_the_reason_and_keeps_torchs_error_as_its_cause():
  module = tb.TorchModule(_Branchy(), name="served")
  with pytest.raises(_export_errors.ExportError) as raised:
    tb.translate(module, input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  err = raised.value
  assert "depends on tensor values" in str(err) or "data-dependent" in str(err)
  assert "(test_refusal_messages.py:" in str(err)  # the user's line
  assert "TORCHDYNAMO" not in str(err) and "\n" not in err.summary
  assert err.__cause__ is not None and "data-dependent" in err.detail


def test_other_errors_keep_their_type_and_first_line():
  err = RuntimeError("Unsupported: call_method foo\n\nFrom user code:\n  File x")
  assert _export_errors.summary(err) == "RuntimeError: Unsupported: call_method foo"


@pytest.mark.parametrize("run", ["auto", "tf"])
def test_a_refused_export_is_not_exported_again_for_the_torch_runner(run, monkeypatch):
  """When torch.export refuses the TF runner's capture, the C++ torch runner
  takes that refusal instead of running the same export a second time."""
  exports = []
  real = torch.export.export

  def counted(*args, **kwargs):
    exports.append(1)
    return real(*args, **kwargs)

  monkeypatch.setattr(torch.export, "export", counted)
  call, args = _lstm_call(run, f"lstm_once_{run}")
  if run == "tf":
    with pytest.raises(ValueError, match="depends on tensor values"):
      call(*args)
  else:
    call(*args)
  assert len(exports) == 1


def test_a_record_keeps_torchs_error_only_while_its_reason_stands():
  from torchbridge._runners import _record  # pylint: disable=import-outside-toplevel

  class Owner:  # a module's state: the record's key
    pass

  owner = Owner()
  _record.record(owner, "kept", "torch", "torch.export refused", path="C++", detail="torch's error")
  _record.record(owner, "kept", "torch", "torch.export refused", path="C++")  # another signature
  assert _record.choices()["kept"]["detail"] == "torch's error"
  _record.record(owner, "kept", "tf", "")  # a later capture that holds: no stale detail
  assert "detail" not in _record.choices()["kept"]


def test_two_modules_of_one_name_keep_a_record_each():
  from torchbridge._runners import _record  # pylint: disable=import-outside-toplevel

  class Owner:
    pass

  first, second = Owner(), Owner()
  _record.record(first, "twin", "torch", "an op has no TF translation", path="C++")
  _record.record(second, "twin", "tf", "")
  choices = _record.choices()
  assert choices["twin"]["runner"] == "tf"  # the latest recorded has the name
  assert choices["twin #2"]["runner"] == "torch"
  del second  # a module freed: its entry goes with it
  assert _record.choices()["twin"]["runner"] == "torch"
