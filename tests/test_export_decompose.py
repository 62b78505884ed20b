"""`_decompose.in_final_form`: where it says `run_decompositions` has
nothing to do (and a capture skips it, ~0.4 s each), running it leaves
the graph as it is. Checked on torch's own module_db, both tables (the
translation's, and the C++ torch runner's empty one)."""

import warnings

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal needs it

import torch  # noqa: E402  (before TensorFlow)

from torchbridge._translate import _decompose  # noqa: E402

with warnings.catch_warnings():
  warnings.simplefilter("ignore", ImportWarning)
  from torch.testing._internal.common_modules import module_db  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.one_pass]

TABLES = {"translation": _decompose.table, "torch runner": dict}


def _programs():
  """An exported program per module_db module (its first sample with
  tensor arguments only), in train and eval mode."""
  for info in module_db:
    for training in (True, False):
      try:
        (sample, *_) = [
          s
          for s in info.module_inputs_func(
            info, device="cpu", dtype=torch.float32, requires_grad=False, training=training
          )
          if s.forward_input is not None
          and not s.forward_input.kwargs
          and all(isinstance(a, torch.Tensor) for a in s.forward_input.args)
        ]
        cargs = sample.constructor_input
        module = info.module_cls(*cargs.args, **cargs.kwargs)
        if info.is_lazy:
          with torch.no_grad():
            module(*sample.forward_input.args)
        module.train(training)
        with warnings.catch_warnings():
          warnings.simplefilter("ignore")
          program = torch.export.export(module, tuple(sample.forward_input.args))
      except Exception:  # pylint: disable=broad-except  (no sample, or no export)
        continue
      yield f"{info.name}/{'train' if training else 'eval'}", program


def _form(program):
  nodes = [(n.op, str(n.target), str(n.args), str(n.kwargs)) for n in program.graph.nodes]
  return nodes, str(program.graph_signature)


def test_a_program_in_final_form_is_what_run_decompositions_gives():
  skipped = {table: [] for table in TABLES}
  decomposed = {table: [] for table in TABLES}
  for name, program in _programs():
    for table_name, table in TABLES.items():
      if not _decompose.in_final_form(program, table()):
        decomposed[table_name].append(name)
        continue
      skipped[table_name].append(name)
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = program.run_decompositions(table())
      assert _form(again) == _form(program), (table_name, name)
  # Not vacuous: both answers occur, for each table.
  for table_name in TABLES:
    assert len(skipped[table_name]) >= 10, (table_name, skipped[table_name])
    assert len(decomposed[table_name]) >= 10, (table_name, decomposed[table_name])
  # What the rules refuse: a buffer written (BatchNorm in training), an
  # op torch decomposes whatever the table says (conv2d), an op with a
  # kernel in Python (multi_margin_loss); what they let through.
  for table_name in TABLES:
    assert "nn.BatchNorm1d/train" in decomposed[table_name]
    assert "nn.Conv2d/eval" in decomposed[table_name]
    assert "nn.MultiMarginLoss/eval" in decomposed[table_name]
    assert "nn.Linear/eval" in skipped[table_name]
    assert "nn.ReLU/train" in skipped[table_name]


def test_a_dynamic_batch_keeps_the_rule():
  """A dynamic batch: an MLP's graph has no symbolic size in it and skips;
  a graph that reads one (`sym_size`, for a reshape or a new tensor) does
  not. Where the rule skips, the graph is what run_decompositions gives."""
  mlp = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

  class Reshaping(torch.nn.Module):
    def forward(self, x):
      return torch.relu(x).reshape(x.shape[0], -1).sum(1)

  class Filled(torch.nn.Module):
    def forward(self, x):
      return x * torch.full((x.shape[0], 1), 2.0)

  batch = torch.export.Dim("batch", min=2)
  seen = []
  cases = (
    (mlp, torch.randn(4, 3)),
    (Reshaping(), torch.randn(4, 2, 3)),
    (Filled(), torch.randn(4, 3)),
  )
  for module, example in cases:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    for table in TABLES.values():
      final = _decompose.in_final_form(program, table())
      seen.append(final)
      if final:
        with warnings.catch_warnings():
          warnings.simplefilter("ignore")
          assert _form(program.run_decompositions(table())) == _form(program)
  assert seen == [True, True, False, False, False, False]
