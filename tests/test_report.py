"""benchmarks/report.py's tables for the docs: the user pages' tables say
what each row measured in the API's words and show none of the workshop;
the targets go to Contributing's page."""

import importlib.util
import json
from pathlib import Path
import re

import pytest

from benchmarks import report
from benchmarks import user_tables

# No bridged call: `make test` runs it in the native pass only.
pytestmark = pytest.mark.one_pass

ROOT = Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("_doc_checks", ROOT / "docs" / "_checks.py")
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)
CLASS_NAMES = checks.benchmark_class_names(ROOT)


def _read(path):
  return (ROOT / path).read_text()


def _html_of_tables(markdown):
  """The Markdown tables' header rows as the site's HTML heads them, so
  that `workshop` finds a targets table in them."""
  heads = [
    "<thead><tr>" + "".join(f"<th>{c.strip()}</th>" for c in line.strip("|").split("|")) + "</tr>"
    "</thead>"
    for line, rule in zip(markdown.splitlines(), markdown.splitlines()[1:])
    if rule.startswith("|---")
  ]
  return markdown + "".join(heads)


@pytest.mark.parametrize(
  "name", ["costs", "costs-steps", "runners", "runner-calls", *sorted(user_tables.USER_VIEWS)]
)
def test_every_user_table_shows_no_workshop(name):
  table = user_tables.page_table(name, _read)
  assert table.strip()
  assert checks.workshop(_html_of_tables(table), CLASS_NAMES) == []
  assert "contender" not in table.lower()
  assert not re.search(r"(?<![\w'])us\b", table), "microseconds are µs on the user pages"


def test_costs_tables_name_the_python_path_and_leave_td3_and_the_targets_out():
  results = json.loads(_read("benchmarks/results/latest.json"))
  table = report.markdown(results)
  # latest.json's "torchbridge tf.function" ran run="torch" with its C++
  # runner off: the Python path, said so on every row and column.
  assert '| `run="torch"`, Python path, in a `tf.function` |' in table
  assert "torchbridge tf.function" not in table
  assert "td3" not in table.lower() and "target" not in table
  # The small MLP's step on the Python path is the runners page's figure
  # (runners.json): here it is split into its parts, not stated again.
  steps = results["train_steps"]["small_mlp"]
  small = steps["torchbridge tf.function"]["median_us"] / 1e3
  assert f"{small:.2f}" not in table and f"{small:#.3g}" not in table
  assert "| ms per train step, the larger models" in table
  assert "| small MLP |" not in table.split("\n", 1)[0]
  parts = dict(results["decomposition"]["small_mlp"])
  assert f"| {parts['pure torch step (torch Adam)']:.2f} |" in table
  # The other bridges, as what each adds over the step the parts split.
  numpy_adds = steps["numpy-copy bridge tf.function"]["median_us"] / 1e3 - small
  assert f"| a bridge that copies through numpy instead: what that adds | {numpy_adds:+.2f} |" in (
    table
  )
  # The page's two markers: the crossings, then the steps it splits.
  assert user_tables.page_table("costs", _read) == report.crossings_markdown(results)
  assert user_tables.page_table("costs-steps", _read) == report.steps_markdown(results)
  assert table == report.crossings_markdown(results) + "\n" + report.steps_markdown(results)
  targets = report.targets_markdown(results)
  assert targets.startswith("| target | measured | met |")
  assert all(t["name"] in targets for t in results["targets"])


def test_costs_tables_state_no_runner_comparison():
  # Each runner's step against the Keras port and pure torch is the runners
  # page's (runners.json): the costs page shows no ratio between its rows and
  # no Keras step in a `tf.function`, only the steps its split uses.
  table = report.markdown(json.loads(_read("benchmarks/results/latest.json")))
  assert " / pure torch" not in table and " / the Keras" not in table
  assert "the Keras port, in a `tf.function`" not in table
  assert "Keras model" not in table
  assert (
    '| the small MLP\'s step, `run="torch"`, Python path, part by part (from medians over '
    "processes) | ms |" in table
  )


def test_runners_tables_label_each_runner_and_hold_xla_to_keras_under_xla():
  def row(us):
    return {"median_us": us, "torch": "2.13.0+cpu"}

  rows = {
    "torchbridge": row(1100.0),
    "torchbridge, XLA": row(900.0),
    'torchbridge, run="torch" (C++ torch runner)': row(1300.0),
    'torchbridge, run="torch", Python path': row(1500.0),
    "Keras port": row(1000.0),
    "Keras port, XLA": row(600.0),
    "pure torch": row(1250.0),
  }
  runners = {"rounds": 3, "threads": 2, "venvs": {"python": {"small_mlp": rows}}}
  table = user_tables.runners_markdown(runners)
  assert "**torch 2.13 (CPU build)**" in table
  assert "| torchbridge (the default runner) | 1.10 | 1.10x | 0.88x |" in table
  # Under XLA, against the Keras port under XLA.
  assert "| torchbridge, the train step `jit_compile=True` | 0.90 | 1.50x | 0.72x |" in table
  assert '| `run="torch"` (torch from C++) | 1.30 | 1.30x | 1.04x |' in table
  assert '| `run="torch"`, Python path | 1.50 | 1.50x | 1.20x |' in table
  assert "| pure torch | 1.25 |" in table  # one pure torch: no "as written"
  assert user_tables.torch_build("2.15.0+cu132").startswith(
    "torch 2.15 as `pip install torch` gives it"
  )


def test_a_user_view_fails_when_its_table_no_longer_holds_what_it_replaces():
  user_tables.USER_VIEWS["benchmarks/results/plain.md"] = ()
  try:
    # The commit dropped, the torch build named as the user pages name it.
    assert (
      user_tables.user_view(
        "benchmarks/results/plain.md", "Pure torch's step, at 3ab7de1: torch 2.13.0+cpu"
      )
      == "Pure torch's step: torch 2.13 (CPU build)"
    )
  finally:
    del user_tables.USER_VIEWS["benchmarks/results/plain.md"]
  user_tables.USER_VIEWS["benchmarks/results/missing.md"] = (("| contender |", "| |"),)
  try:
    with pytest.raises(ValueError, match="no longer holds"):
      user_tables.user_view("benchmarks/results/missing.md", "| runner | ms |")
  finally:
    del user_tables.USER_VIEWS["benchmarks/results/missing.md"]
  with pytest.raises(ValueError, match="no user view"):
    user_tables.user_view("benchmarks/results/runners.md", "")


def test_the_step_breakdown_page_names_each_step_runner_and_thread():
  view = user_tables.page_table("benchmarks/results/step_breakdown.md", _read)
  headings = [line for line in view.splitlines() if line.startswith("#")]
  assert headings
  for heading in headings:
    # No benchmark keys: the steps, runners and threads in words.
    assert not re.search(r"td3|small_mlp|-thread", heading), heading
  assert (
    '## TD3 train step, `run="torch"`, Python path, graph calls on the torch thread' in headings
  )
  assert '## TD3 train step, `run="torch"` from C++, graph calls on TF\'s thread' in headings
  # The small MLP's step has no target networks: no Polyak updates.
  sections = re.split(r"^## ", view, flags=re.M)
  small = [s for s in sections if s.startswith("Small MLP")]
  assert len(small) == 2 and not any("Polyak" in s for s in small)
  assert all("| TF ops (kernels: the loss, Keras Adam) |" in s for s in small)
  # A recorded step faster than the unrecorded one: noise, not a negative cost.
  assert "0.899x (under 1: what profiling costs is within the noise)" in view
  assert "(what profiling costs)" in view  # and the costs over 1 as they are
  # The profiled sections hold their step against the recorded section's
  # unrecorded step (a mean of the middle 80%), not a median of other steps.
  assert "(median " not in view
  assert "the unrecorded step of the section above" in view


def test_the_load_views_say_the_conditions_and_one_eager_row():
  load = user_tables.page_table("benchmarks/results/load.md", _read)
  breakdown = user_tables.page_table("benchmarks/results/load_breakdown.md", _read)
  for table in (load, breakdown):
    assert not re.search(r"busy\d|nice19|\+cpu|Keras model", table)
    assert "| beside 1 busy process |" in table and "torch 2.13 (CPU build)" in table
  # Eager calls run torch whatever the runner: one row, the median of the
  # run's three (537, 536, 538 quiet; 542, 536, 531 beside a busy process).
  eager = load[load.index("**One eager call") :]
  assert "| a `tb.TorchModule` eager call (any runner) | 537 | 536 | 0.37x |" in eager
  assert "run=" not in eager and "default runner" not in eager
  # An eager `actor(obs)`, not "the policy call": the TD3 example acts
  # through the held `actor.torch_module`, at pure torch's cost.
  assert "policy call" not in eager.split("\n", 1)[0]
  assert "(`actor(obs)`, as a policy that acts eagerly calls it" in eager


def test_the_real_models_view_names_the_models():
  view = user_tables.page_table("benchmarks/results/real_models.md", _read)
  assert not re.search(r"\b(bert|gpt2|resnet18):", view)
  assert "Sizes: BERT-base: 12 layers" in view
  assert "- BERT-base, training: torch from C++: an op has no TF translation" in view
  # The runner column in the pages' words; the slow line names every
  # `tb.TorchModule` row, not "torchbridge" (the default runner's alone).
  assert "| torch from C++ |" in view and "| TF translation |" in view
  assert not re.search(r"\| (tf|torch \(C\+\+\)) \|", view)
  assert "pure torch's (the `tb.TorchModule` rows):" in view
  assert "alternated round(s)" not in view


def test_a_pattern_edit_fails_when_its_table_no_longer_holds_it():
  path = "benchmarks/results/missing.md"
  user_tables.USER_VIEWS[path] = ((re.compile(r"^\| keras \|", re.M), "| the Keras port |"),)
  try:
    assert user_tables.user_view(path, "| keras | 1 |") == "| the Keras port | 1 |"
    with pytest.raises(ValueError, match="no longer holds"):
      user_tables.user_view(path, "| Keras | 1 |")
  finally:
    del user_tables.USER_VIEWS[path]
