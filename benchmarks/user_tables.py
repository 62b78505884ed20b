"""The tables user pages show from committed results, in the user pages'
words (docs/_hooks.py: `<!-- report NAME -->` -> `page_table(NAME)`).

The costs page's tables and the targets come from `report` (latest.json);
the runners page's from runners.json; a benchmark's own committed table is
shown with `USER_VIEWS`' edits, each of which fails the build when the
text it edits is gone.

Example:
  >>> torch_build("2.13.0+cpu")
  'torch 2.13 (CPU build)'
"""

import json
import re
import statistics

from benchmarks.report import NOTHING
from benchmarks.report import PYTHON_PATH
from benchmarks.report import crossings_markdown
from benchmarks.report import steps_markdown
from benchmarks.report import targets_markdown

# benchmarks/runners.py's contenders (runners.json), as the runners page
# names them.
RUNNER_ROWS = {
  "torchbridge": "torchbridge (the default runner)",
  "torchbridge, XLA": "torchbridge, the train step `jit_compile=True`",
  'torchbridge, run="torch" (C++ torch runner)': '`run="torch"` (torch from C++)',
  'torchbridge, run="torch", Python path': PYTHON_PATH,
  'torchbridge, run="torch" (C++ torch runner), XLA': (
    '`run="torch"` (torch from C++), the train step `jit_compile=True`'
  ),
  "Keras port": "the Keras port",
  "Keras port, XLA": "the Keras port, `jit_compile=True`",
  "pure torch": "pure torch, as written",
  "pure torch, actor loss for the actor only": (
    "pure torch, the actor's loss for the actor's parameters only"
  ),
}
RUNNER_CALL_ROWS = {
  'torchbridge, run="torch" (C++ torch runner)': '`run="torch"` (torch from C++)',
  'torchbridge, run="torch", Python path': PYTHON_PATH,
  "bare op, C++ callback (no torch compute)": (
    f"{NOTHING}: the native op, its C++ callback computing nothing"
  ),
  'torchbridge, run="torch" (C++ torch runner), XLA': (
    '`run="torch"` (torch from C++), in a function compiled by XLA'
  ),
  "bare op, C++ callback (no torch compute), XLA": (
    "the native op computing nothing, in a function compiled by XLA"
  ),
  "TF ops, XLA (the same Linear, no torch)": (
    "the same `Linear` as TF ops, in a function compiled by XLA"
  ),
}
_XLA_ROWS = {n for n in (*RUNNER_ROWS, *RUNNER_CALL_ROWS) if ", XLA" in n}


def torch_build(version):
  """A torch version as the user pages name it: "torch 2.13 (CPU build)",
  or the CUDA build `pip install torch` gives on Linux."""
  release = ".".join(version.split("+")[0].split(".")[:2])
  if version.endswith("+cpu"):
    return f"torch {release} (CPU build)"
  return f"torch {release} as `pip install torch` gives it (its CUDA build, run on the CPU)"


def _runner_venvs(runners):
  """[(torch build, {model: rows})] of a runners.json, in its order."""
  out = []
  for models_ in runners["venvs"].values():
    version = next(iter(next(iter(models_.values())).values()))["torch"]
    out.append((torch_build(version), models_))
  return out


def _timings_per_process(runners):
  """How many timings each process of a runners.json took ("7", from its
  rows' `samples_us`), or "" where it does not say."""
  counts = {
    len(process["samples_us"])
    for models_ in runners["venvs"].values()
    for rows in models_.values()
    for row in rows.values()
    for process in row.get("processes", ())
    if "samples_us" in process
  }
  return "/".join(str(n) for n in sorted(counts))


def runners_markdown(runners):
  """The runners page's tables (runners.json): the TD3 and small-MLP train
  steps per runner, with and without XLA, against the Keras port (the same
  XLA setting) and pure torch, for each torch build measured."""
  timings = " ".join(filter(None, (_timings_per_process(runners), "timings")))
  out = [
    f"{runners['rounds']} alternated rounds, {runners['threads']} threads, each row in "
    f"processes of its own, one a round; in each process, warmed up, {timings} of "
    "about 0.25 s of steps, their median; a row's figure, the median of its processes' "
    "medians; random batches.",
    "",
  ]
  titles = {"td3": "TD3 train step (batch 256)", "small_mlp": "small MLP train step"}
  for build, models_ in _runner_venvs(runners):
    out += [f"**{build}**", ""]
    for model, rows in models_.items():
      if model not in titles:
        continue
      keras, keras_xla = rows["Keras port"]["median_us"], rows["Keras port, XLA"]["median_us"]
      pure = rows["pure torch"]["median_us"]
      actor_only = rows.get("pure torch, actor loss for the actor only")
      extra = " / pure torch, the actor's loss for the actor only |" if actor_only else ""
      out += [
        f"| {titles[model]} | ms | / the Keras port (same XLA setting) | / pure torch |{extra}",
        "|---|---|---|---|" + ("---|" if actor_only else ""),
      ]
      for name, row in rows.items():
        us = row["median_us"]
        same = keras_xla if name in _XLA_ROWS else keras
        cells = [f"{us / 1e3:.2f}", f"{us / same:.2f}x", f"{us / pure:.2f}x"]
        if actor_only:
          cells.append(f"{us / actor_only['median_us']:.2f}x")
        label = RUNNER_ROWS.get(name, name)
        if name == "pure torch" and not actor_only:  # one pure torch: no "as written"
          label = "pure torch"
        out.append(f"| {label} | " + " | ".join(cells) + " |")
      out.append("")
  return "\n".join(out).rstrip("\n") + "\n"


def runners_call_markdown(runners):
  """The cost of one graph call on each torch path (runners.json's `call`):
  a `Linear(4, 4)` on a batch of 1, against the same TF program with the
  bridge doing nothing (same XLA setting), for each torch build measured."""
  out = []
  for build, models_ in _runner_venvs(runners):
    rows = models_.get("call")
    if not rows:
      continue
    nothing = "bare op, C++ callback (no torch compute)"
    out += [
      f"| one forward graph call of `Linear(4, 4)`, batch 1, {build} | µs "
      "| over the bridge doing nothing (same XLA setting), µs |",
      "|---|---|---|",
    ]
    for name, row in rows.items():
      base = rows[f"{nothing}, XLA" if name in _XLA_ROWS and f"{nothing}, XLA" in rows else nothing]
      us = row["median_us"]
      out.append(
        f"| {RUNNER_CALL_ROWS.get(name, name)} | {us:.1f} | {us - base['median_us']:+.1f} |"
      )
    out.append("")
  return "\n".join(out).rstrip("\n") + "\n"


# A committed results table (a benchmark's own Markdown) as a user page shows
# it: the commit it measured dropped (the results files table on
# Contributing's measurement page has it), its torch build named as the user
# pages name it, and each of its suite words replaced. Every replaced text
# must be there: a benchmark that rewrites its table fails the build here
# until this list follows it.
_COMMIT = re.compile(r"^At [0-9a-f]{7,40}: |,? at [0-9a-f]{7,40}\b", re.M)
_TORCH_BUILD = re.compile(r"\btorch (\d+\.\d+\.\d+\+(?:cpu|cu\d+))")
# load.md's eager calls: a `tb.TorchModule` eager call runs torch whatever its
# runner, so its three rows (one per runner the run built the module with)
# time the same call: one row, each cell their median.
_EAGER_ROWS = re.compile(
  r"^\| torchbridge \(default: TF runner\) \| (\d+) \| (\d+) \| ([\d.]+)x \|\n"
  r"\| torchbridge run='torch' \(C\+\+ runner\) \| (\d+) \| (\d+) \| ([\d.]+)x \|\n"
  r"\| torchbridge run='torch' \(Python path\) \| (\d+) \| (\d+) \| ([\d.]+)x \|$",
  re.M,
)


def _eager_row(match):
  quiet, busy, ratio = (
    statistics.median(float(match.group(k)) for k in (first, first + 3, first + 6))
    for first in (1, 2, 3)
  )
  return f"| a `tb.TorchModule` eager call (any runner) | {quiet:.0f} | {busy:.0f} | {ratio:.2f}x |"


# The load runs' conditions, as the pages say them.
_BUSY = (
  ("| busy1 |", "| beside 1 busy process |"),
  ("| busy2 |", "| beside 2 busy processes |"),
)
_CONDITIONS = (*_BUSY, ("| nice19 busy1 |", "| niceness 19, beside 1 busy process |"))
_LOAD_ROWS = (
  ("| keras |", "| the Keras port |"),
  ("| torchbridge (default: TF runner) |", "| torchbridge (the default runner) |"),
  ("| torchbridge run='torch' (C++ runner) |", '| `run="torch"` (torch from C++) |'),
  ("| torchbridge run='torch' (Python path) |", f"| {PYTHON_PATH} |"),
)
USER_VIEWS = {
  "benchmarks/results/load.md": (
    (_EAGER_ROWS, _eager_row),
    ("| contender |", "| |"),
    ("the same contender's quiet step", "the same row's quiet step"),
    ("each environment step; us)", "each environment step; µs)"),
    # An eager `actor(obs)`: not the policy call of the TD3 example, which
    # acts through the held `actor.torch_module` at pure torch's cost.
    (
      "(the policy call of each environment step;",
      "(`actor(obs)`, as a policy that acts eagerly calls it each environment step;",
    ),
    ("| vs Keras, quiet |", "| vs the Keras port, quiet |"),
    *_CONDITIONS,
    ("| nice19 busy2 |", "| niceness 19, beside 2 busy processes |"),
    *_LOAD_ROWS,
  ),
  "benchmarks/results/load_breakdown.md": (
    ("the same contender's quiet step", "the same row's quiet step"),
    ("the median process; us per step)", "the median process; µs per step)"),
    ("**Keras and the default runner again**", "**The Keras port and the default runner again**"),
    (
      "the default runner's ratio over Keras' ratio",
      "the default runner's ratio over the Keras port's",
    ),
    ("| condition | Keras |", "| condition | the Keras port |"),
    ("| ratio over Keras' |", "| ratio over the Keras port's |"),
    ("| torchbridge (default: TF runner) |", "| torchbridge (the default runner) |"),
    *_CONDITIONS,
  ),
  "benchmarks/results/load_torch_remedies.md": _BUSY,
  "benchmarks/results/ddpg_loop.md": (
    ("| target updates |", "| updating the target networks |"),
    ("| vs Keras |", "| vs the Keras port |"),
    ("| keras |", "| the Keras port |"),
    ("| torchbridge |", "| torchbridge (the default runner) |"),
    ("| torchbridge run='torch' |", '| `run="torch"` (torch from C++) |'),
  ),
  "benchmarks/results/real_models.md": (
    (" (Intel(R) Xeon(R) Processor)", " (x86_64)"),
    ("| contender |", "| |"),
    # Every `tb.TorchModule` row, on any runner (not "torchbridge": the
    # default runner's alone).
    ("(torchbridge contenders)", "(the `tb.TorchModule` rows)"),
    ('| torchbridge, run="torch" |', '| `run="torch"` |'),
    ('torchbridge, run="torch":', '`run="torch"`:'),
    ('the default runner, run="torch";', 'the default runner, `run="torch"`;'),
    # The runner column, as the pages name the runners.
    ("| tf |", "| TF translation |"),
    ("| torch (C++) |", "| torch from C++ |"),
    # The models by their names, not the benchmark's keys.
    ("Sizes: bert: ", "Sizes: BERT-base: "),
    ("; gpt2: ", "; GPT-2 small: "),
    ("; resnet18: ", "; ResNet-18: "),
    (", bert: torch: ", ": torch from C++: "),
    (", gpt2: torch: ", ": torch from C++: "),
    (", resnet18: torch: ", ": torch from C++: "),
  ),
  "benchmarks/results/first_call_breakdown.md": (
    ("# BERT-base's first training step, by part\n\n", ""),
    ("the TF contenders' first step", "the TF rows' first step"),
    (" (benchmarks/first_call_breakdown.py)", ""),
    ("| contender |", "| |"),
    ("| run='torch', a later process", '| `run="torch"`, a later process'),
    (
      "\nEarlier (commit 07e38c1, before issue 54's changes): default runner, first "
      "process, 51.59 s first step, of which torch.export 1.99, lowering 4.71, parity check "
      "16.13 s.",
      "",
    ),
  ),
  "benchmarks/results/step_breakdown.md": (
    # Its lines on the suite's other programs (the bridge doing nothing, the
    # leanest Python bridge, the C++ runner's own floor): Contributing's.
    ("- The same step with bare native ops", None),
    ("- The floor with torch tensors in and out", None),
    ("- The same ops running the same torch modules through the leanest", None),
    ("- The same step on the C++ torch runner", None),
    ("TF's side, the bridged step against the floor", None),
    ("The C++ torch runner's step, recorded by", "Recorded by"),
  ),
}


def user_view(path, text):
  """A committed results table (`path`, its text) as a user page shows it:
  `USER_VIEWS[path]`'s edits (`(old, new)` replaces the text old, `(start,
  None)` drops every line that starts so, `(pattern, new)` substitutes a
  compiled regular expression), the commit dropped, torch builds named as
  `torch_build` names them."""
  if path not in USER_VIEWS:
    raise ValueError(f"no user view of {path}: add its edits to USER_VIEWS in {__file__}")
  for old, new in USER_VIEWS[path]:
    if isinstance(old, re.Pattern):
      text, found = old.subn(new, text)
      if not found:
        raise ValueError(f"{path} no longer holds {old.pattern!r}: update USER_VIEWS in {__file__}")
      continue
    lines = text.split("\n")
    kept = [line for line in lines if not line.startswith(old)] if new is None else lines
    if old not in text or len(kept) == len(lines) and new is None:
      raise ValueError(f"{path} no longer holds {old!r}: update USER_VIEWS in {__file__}")
    text = "\n".join(kept) if new is None else text.replace(old, new)
  text = _TORCH_BUILD.sub(lambda m: torch_build(m.group(1)), text)
  return _COMMIT.sub("", text)


def page_table(name, read):
  """The table a page's `<!-- report NAME -->` stands for (docs/_hooks.py).

  Args:
    name: "costs" (the exchange and one call), "costs-steps" (the steps
      the costs page splits), "targets", "runners", "runner-calls", or a
      committed results table's path (`user_view`).
    read: reads a repository path and returns its text.
  """
  if name in ("costs", "costs-steps", "targets"):
    results = json.loads(read("benchmarks/results/latest.json"))
    show = {"costs": crossings_markdown, "costs-steps": steps_markdown}.get(name, targets_markdown)
    return show(results)
  if name in ("runners", "runner-calls"):
    runners = json.loads(read("benchmarks/results/runners.json"))
    return runners_markdown(runners) if name == "runners" else runners_call_markdown(runners)
  return user_view(name, read(name))
