"""Targets, the printed table, the JSON file, the plots, the docs' tables.

`python -m benchmarks.report [benchmarks/results/latest.json]` prints the
costs page's tables and the run's targets from a run's JSON file. The
docs' tables are written into their pages when the site is built
(`page_table`, called by docs/_hooks.py for `<!-- report NAME -->`).
"""

import json
import os
import re
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


BRIDGED = "torchbridge tf.function"
# `decomposition`'s first row: the bridged step the other rows split.
BRIDGED_STEP = "torchbridge tf.function step"
PURE_TORCH = "pure torch"
KERAS = "keras tf.function"
TORCH_FORWARD_BACKWARD = "pure torch, forward and backward only"
MODELS = ("small_mlp", "cnn", "large_mlp")
# The suite's TD3 contender whose torch modules run on the same native ops
# through the leanest Python bridge one can write (bare_native.LeanTorchModule).
LEAN_TD3 = "leanest Python bridge on the same ops (bare_native.LeanTorchModule)"
# The one whose modules are captured with torch.export and run from the ops'
# kernel in C++, with no Python per call (scripted_native.ScriptedTorchModule).
SCRIPTED_TD3 = "no-Python bridge on the same ops (scripted_native.ScriptedTorchModule)"
# torchbridge with its modules' graph calls traced and run in C++.
TORCH_RUNNER_TD3 = 'torchbridge, run="torch" (C++ torch runner)'


def _median(timings, name):
  return timings[name]["median_us"]


def _ratio(a, b, key):
  """a / b over processes: the ratio of medians, and round by round (the
  k-th process of each, started one after the other)."""
  per_round = [ra[key] / rb[key] for ra, rb in zip(a["processes"], b["processes"])]
  return {
    "ratio": a[key] / b[key],
    "per_round": per_round,
    "min": min(per_round),
    "max": max(per_round),
  }


def _step_sets(results):
  """{name: (timings, key, bridged, pure torch, keras)} of every step
  measured in processes of their own: the three models and TD3."""
  sets = {
    m: (t, "median_us", BRIDGED, PURE_TORCH, KERAS)
    for m, t in results.get("train_steps", {}).items()
  }
  if "td3" in results:
    sets["td3"] = (results["td3"], "ms_per_train_step", "torchbridge", "pure torch", "keras")
  return sets


def headline(results):
  """Per model (and TD3): torchbridge / pure torch and torchbridge / Keras,
  both from clean processes."""
  out = {}
  for name, (t, key, bridged, torch_, keras) in _step_sets(results).items():
    if bridged in t and torch_ in t and keras in t:
      out[name] = {
        "torchbridge / pure torch": _ratio(t[bridged], t[torch_], key),
        "torchbridge / keras": _ratio(t[bridged], t[keras], key),
      }
  return out


def decomposition(results):
  """What a bridged step is made of, from the separate-process figures (ms):
  the step, pure torch, the floor (the same TF program with each bridged
  call a bare native op), and their differences."""
  out = {}
  steps = results.get("train_steps", {})
  floors = [n for n in steps.get("small_mlp", {}) if n.startswith("floor:")]
  if floors and BRIDGED in steps["small_mlp"] and PURE_TORCH in steps["small_mlp"]:
    t = steps["small_mlp"]
    ms = {n: t[n]["median_us"] / 1e3 for n in t}
    b, p, f = ms[BRIDGED], ms[PURE_TORCH], ms[floors[0]]
    rows = [(BRIDGED_STEP, b), ("pure torch step (torch Adam)", p)]
    if TORCH_FORWARD_BACKWARD in ms:
      rows.append(("pure torch forward and backward only", ms[TORCH_FORWARD_BACKWARD]))
    rows += [
      (floors[0], f),
      ("bridged - pure torch: what running it from TF adds", b - p),
      ("bridged - floor: torch's compute and the bridge's own work", b - f),
    ]
    if TORCH_FORWARD_BACKWARD in ms:
      rows.append(
        (
          "bridged - floor - torch forward and backward: the bridge's "
          "own work (hand-overs, Python) and torch slowed between TF calls",
          b - f - ms[TORCH_FORWARD_BACKWARD],
        )
      )
    out["small_mlp"] = rows
  td3 = results.get("td3", {})
  floors = [n for n in td3 if n.startswith("floor:")]
  if floors and "torchbridge" in td3 and "pure torch" in td3:
    ms = {n: td3[n]["ms_per_train_step"] for n in td3}
    b, p, f = ms["torchbridge"], ms["pure torch"], ms[floors[0]]
    out["td3"] = [
      ("torchbridge train step", b),
      ("pure torch train step (torch Adam)", p),
      ("Keras train step", ms.get("keras", float("nan"))),
      (floors[0], f),
      ("bridged - pure torch: what running it from TF adds", b - p),
      ("bridged - floor: torch's compute and the bridge's own work", b - f),
    ]
    if LEAN_TD3 in ms:
      out["td3"] += [
        (LEAN_TD3, ms[LEAN_TD3]),
        ("bridged - leanest Python bridge: torchbridge's own code", b - ms[LEAN_TD3]),
      ]
    if SCRIPTED_TD3 in ms:
      out["td3"] += [
        (SCRIPTED_TD3, ms[SCRIPTED_TD3]),
        (
          "bridged - no-Python bridge: Python per call (the module's own included, "
          "and eager torch against the C++ torch runner's dispatcher calls)",
          b - ms[SCRIPTED_TD3],
        ),
      ]
  return out


def floors(results):
  """The targets' measures taken on the leanest Python bridge on the same
  native ops (`bare_native.LeanTorchModule`; the suite's `LEAN_TD3`) and on
  the bridge with no Python per call (`scripted_native.ScriptedTorchModule`;
  `SCRIPTED_TD3`), as {"name", "measured", "limit"} records: how close any
  bridge that runs the user's torch module in Python gets, and one that
  runs a traced copy of it from C++."""
  out = []

  def add(name, measured, limit):
    out.append({"name": name, "measured": measured, "limit": limit})

  td3 = results.get("td3", {})
  torch_ = td3.get("pure torch")
  labels = {
    LEAN_TD3: "leanest Python bridge",
    TORCH_RUNNER_TD3: TORCH_RUNNER_TD3,
    SCRIPTED_TD3: "no-Python bridge",
  }
  for contender, label in labels.items():
    record = td3.get(contender)
    if not (record and torch_):
      continue
    add(
      f"TD3 train step: {label} / pure torch",
      record["ms_per_train_step"] / torch_["ms_per_train_step"],
      "<= 1.10",
    )
    if "wall_s" in record and "wall_s" in torch_:
      add(
        f"TD3 script's wall time: {label} / pure torch",
        record["wall_s"] / torch_["wall_s"],
        "<= 1.2",
      )
    if contender == LEAN_TD3 and "torchbridge" in td3:
      add(
        "TD3 train step: torchbridge / leanest Python bridge",
        td3["torchbridge"]["ms_per_train_step"] / record["ms_per_train_step"],
        "the bridge's own code",
      )
  return out


def targets(results):
  """Issue 16's targets (and the exchange, overhead and numpy-copy ones kept
  from before) as {"name", "measured", "limit", "met"} records."""
  out = []

  def add(name, measured, limit, met):
    out.append({"name": name, "measured": measured, "limit": limit, "met": met})

  ex = results.get("exchange", {})
  if "4KB" in ex and "64MB" in ex:
    ratio = _median(ex["64MB"]["timings"], "torchbridge") / _median(
      ex["4KB"]["timings"], "torchbridge"
    )
    add("exchange time 64MB / 4KB (torchbridge)", ratio, "<= 2", ratio <= 2)
  if "16MB" in ex:
    t = ex["16MB"]["timings"]
    speedup = _median(t, "numpy_copy") / _median(t, "torchbridge")
    add("exchange speed-up over numpy copy at 16MB", speedup, ">= 100", speedup >= 100)
  if ex:
    copied = sum(v["bytes_copied"]["torchbridge"] for v in ex.values())
    add("exchange bytes copied (torchbridge, all sizes)", copied, "== 0", copied == 0)
  ratios = headline(results)
  if "td3" in ratios:
    r = ratios["td3"]["torchbridge / pure torch"]["ratio"]
    add("TD3 train step: torchbridge / pure torch", r, "<= 1.10", r <= 1.10)
    r = ratios["td3"]["torchbridge / keras"]["ratio"]
    add("TD3 train step: torchbridge / native Keras", r, "<= 1.0", r <= 1.0)
  td3 = results.get("td3", {})
  if "wall_s" in td3.get("torchbridge", {}) and "wall_s" in td3.get("pure torch", {}):
    r = td3["torchbridge"]["wall_s"] / td3["pure torch"]["wall_s"]
    add(
      "TD3 script's wall time (3,000 environment steps, make demo's loop): "
      "torchbridge / pure torch",
      r,
      "<= 1.2",
      r <= 1.2,
    )
  for model in MODELS:
    if model in ratios:
      r = ratios[model]["torchbridge / pure torch"]["ratio"]
      add(f"{model} tf.function step: torchbridge / pure torch", r, "<= 1.10", r <= 1.10)
  steps = results.get("train_steps", {})
  if "numpy-copy bridge tf.function" in steps.get("large_mlp", {}):
    t = steps["large_mlp"]
    speedup = _median(t, "numpy-copy bridge tf.function") / _median(t, BRIDGED)
    add(
      "large_mlp tf.function step: speed-up over numpy-copy bridge", speedup, ">= 3", speedup >= 3
    )
  t = results.get("overhead", {})
  if "native op doing nothing (in tf.function)" in t:
    own = _median(t, "torchbridge identity, native op (in tf.function)") - _median(
      t, "native op doing nothing (in tf.function)"
    )
    add(
      "bridge's own overhead per call in tf.function, native op (us over a bare native op)",
      own,
      "<= 10",
      own <= 10,
    )
  if "torch_after_bridge" in results:
    r = results["torch_after_bridge"]["ratio_right_after"]
    add(
      "pure torch on the main thread right after 1,000 bridged calls / before them",
      r,
      "<= 1.05",
      r <= 1.05,
    )
  return out


def _foreign(timings):
  """The most other processes' load seen during one of these processes."""
  loads = [p.get("foreign_load_cores") for p in timings["processes"]]
  if None in loads:
    return "others' load unknown"
  return f"others' load up to {max(loads):.2f} cores"


def _range(r):
  return f"{r['ratio']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]"


def table(results):
  lines = []
  for label, entry in results.get("exchange", {}).items():
    t = entry["timings"]
    lines.append(
      f"exchange {label:>6}: torchbridge {_median(t, 'torchbridge'):10.1f} us "
      f"({entry['bytes_copied']['torchbridge']} B copied)   numpy copy "
      f"{_median(t, 'numpy_copy'):10.1f} us "
      f"({entry['bytes_copied']['numpy_copy']} B copied)"
    )
  if "overhead" in results:
    lines.append("")
    lines.append("per-call overhead of an identity (one process, interleaved):")
    for name, t in results["overhead"].items():
      lines.append(f"  {name:60s} {t['median_us']:9.1f} us [{t['p25_us']:.1f}, {t['p75_us']:.1f}]")
  if results.get("headline"):
    lines.append("")
    lines.append(
      "headline, every contender in processes of its own (ratio of medians [per-round min-max]):"
    )
    lines.append(f"  {'':10s} {'torchbridge / pure torch':>26s} {'torchbridge / Keras':>26s}")
    for name, r in results["headline"].items():
      lines.append(
        f"  {name:10s} {_range(r['torchbridge / pure torch']):>26s} "
        f"{_range(r['torchbridge / keras']):>26s}"
      )
  for name, (timings, key, _, torch_, keras) in _step_sets(results).items():
    scale = 1e3 if key == "median_us" else 1.0
    lines.append("")
    lines.append(
      f"training step, {name} (median over processes, ms [min, max], "
      "x pure torch, x Keras; other processes' CPU use meanwhile):"
    )
    width = max(len(c) for c in timings)
    for contender, t in timings.items():
      x_torch = (t[key] / timings[torch_][key]) if torch_ in timings else float("nan")
      x_keras = (t[key] / timings[keras][key]) if keras in timings else float("nan")
      lines.append(
        f"  {contender:{width}s} {t[key] / scale:9.2f} ms "
        f"[{t['min'] / scale:.2f}, {t['max'] / scale:.2f}] "
        f"x{x_torch:5.2f} x{x_keras:5.2f}  "
        f"({len(t['processes'])} processes; {_foreign(t)})"
      )
  for name, rows in results.get("decomposition", {}).items():
    lines.append("")
    lines.append(f"decomposition, {name} (ms per step):")
    width = max(len(label) for label, _ in rows)
    for label, ms in rows:
      lines.append(f"  {label:{width}s} {ms:8.3f}")
  if "torch_after_bridge" in results:
    a = results["torch_after_bridge"]
    lines.append("")
    lines.append("pure torch small-MLP forward and backward on the main thread, same process:")
    for r in a["processes"]:
      lines.append(
        f"  before {r['before_us']:7.1f} us, right after "
        f"{r['bridged_calls']} bridged calls {r['right_after_us']:7.1f} us "
        f"(x{r['ratio_right_after']:.2f}), {r['pause_s']} s later "
        f"{r['after_pause_us']:7.1f} us (x{r['ratio_after_pause']:.2f}); "
        f"others' load {r.get('foreign_load_cores', float('nan')):.2f} cores"
      )
  for model, mem in results.get("peak_memory", {}).items():
    lines.append("")
    lines.append(f"peak memory of a training step, {model}:")
    for name, m in mem.items():
      lines.append(
        f"  {name:12s} +{m['step_peak_mb']:8.1f} MB over "
        f"{m['rss_before_mb']:.1f} MB resident before the steps"
      )
  for failure in results.get("failed_processes", []):
    lines.append("")
    lines.append(
      f"FAILED (started again): {failure['command']}, attempt "
      f"{failure['attempt']}, return code {failure['returncode']}"
    )
  lines.append("")
  lines.append("targets:")
  for t in results["targets"]:
    measured = t["measured"]
    shown = f"{measured:.2f}" if isinstance(measured, float) else str(measured)
    lines.append(
      f"  [{'met' if t['met'] else 'MISSED':6s}] {t['name']}: {shown} (limit {t['limit']})"
    )
  if results.get("floors"):
    lines.append("")
    lines.append("the same measures, other bridges on the same ops:")
    for t in results["floors"]:
      lines.append(f"  {t['name']}: {t['measured']:.2f} (target {t['limit']})")
  return "\n".join(lines)


def write(results, out_dir):
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "latest.json")
  with open(path, "w") as f:
    json.dump(results, f, indent=1)
  plots = [_plot_exchange(results, out_dir), _plot_steps(results, out_dir)]
  return path, [p for p in plots if p]


# The plots are drawn to be read at the docs' column width (about 690 px):
# 7.5 inches wide at PLOT_DPI, no text under 10 points.
PLOT_WIDTH_IN, PLOT_DPI = 7.5, 130


def _plot_exchange(results, out_dir):
  ex = results.get("exchange")
  if not ex:
    return None
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel

  labels = list(ex)
  # Each size where its bytes put it on a log axis (4 KB to 64 MB is not
  # four even steps), labelled with the run's own names for the sizes.
  sizes = [ex[label]["bytes"] for label in labels]
  fig, ax = plt.subplots(figsize=(PLOT_WIDTH_IN, 4.5))
  for name, shown in (("torchbridge", "tb.to_tf(tb.to_torch(x))"), ("numpy_copy", "numpy copies")):
    ax.plot(
      sizes,
      [ex[label]["timings"][name]["median_us"] for label in labels],
      marker="o",
      linewidth=2,
      label=shown,
    )
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.xaxis.set_major_locator(ticker.FixedLocator(sizes))
  ax.xaxis.set_major_formatter(
    ticker.FixedFormatter([re.sub(r"(\d)([KMG]B)", r"\1 \2", s) for s in labels])
  )
  ax.xaxis.set_minor_locator(ticker.NullLocator())
  ax.tick_params(labelsize=11)
  ax.set_xlabel("tensor size (float32, log scale)", fontsize=11)
  ax.set_ylabel("µs, median (log scale)", fontsize=11)
  ax.legend(fontsize=11)
  ax.set_title("A tensor's round trip TF → torch → TF", fontsize=12)
  path = os.path.join(out_dir, "exchange.png")
  fig.tight_layout()
  fig.savefig(path, dpi=PLOT_DPI)
  plt.close(fig)
  return path


def _ratio_axis(ax, low, high):
  """An axis of multiples, labelled 0.5x, 1x, 2x, ... (a handful): a log
  one where they span more than 4x, else a linear one."""
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel

  if high / low > 4:
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=8))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
  else:
    ax.set_xlim(0, high * 1.05)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(6, steps=[1, 2, 5, 10]))
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}x"))


def _plot_steps(results, out_dir):
  """Each step's time as a multiple of pure torch's (median over processes,
  min-max), one panel per model and TD3, one above the other, the 1.10x
  target marked."""
  sets = _step_sets(results)
  if not sets:
    return None
  heights = [0.5 * len(timings) + 1.0 for timings, *_ in sets.values()]
  fig, axes = plt.subplots(
    len(sets),
    1,
    figsize=(PLOT_WIDTH_IN, sum(heights) + 0.6),
    squeeze=False,
    gridspec_kw={"height_ratios": heights},
  )
  for ax, (name, (timings, key, _, torch_, _)) in zip(axes.flat, sets.items()):
    base = timings[torch_][key] if torch_ in timings else 1.0
    names = list(timings)
    mid = [timings[n][key] / base for n in names]
    ax.barh(
      [textwrap.fill(n, 32, break_long_words=False) for n in names],
      mid,
      xerr=[
        [m - timings[n]["min"] / base for m, n in zip(mid, names)],
        [timings[n]["max"] / base - m for m, n in zip(mid, names)],
      ],
      color=["tab:orange" if n in (BRIDGED, "torchbridge") else "tab:blue" for n in names],
    )
    ax.axvline(1.0, color="black", linewidth=1)
    ax.axvline(1.1, color="tab:red", linewidth=1, linestyle="--")
    ax.invert_yaxis()
    _ratio_axis(
      ax,
      min(timings[n]["min"] / base for n in names),
      max(timings[n]["max"] / base for n in names),
    )
    ax.tick_params(axis="y", labelsize=10)
    ax.tick_params(axis="x", labelsize=10)
    scale = 1e3 if key == "median_us" else 1.0
    ax.set_title(f"{name}: pure torch {base / scale:.3g} ms a step", fontsize=12)
  fig.supxlabel(
    "the step's time, x pure torch's (median over processes, min-max; dashed: 1.10x)",
    fontsize=10,
  )
  fig.tight_layout()
  path = os.path.join(out_dir, "train_steps.png")
  fig.savefig(path, dpi=PLOT_DPI)
  plt.close(fig)
  return path


def _us(us):
  return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def _sig(value):
  """Three significant digits, trailing zeros kept: 1.00, 19.6, 336."""
  return f"{value:#.3g}".rstrip(".")


# --- the user pages' tables ---------------------------------------------------
#
# The user pages ("The bridge's cost") show what each row measured in the words
# the API uses: "torchbridge" is the default runner (each module's TF
# translation where it holds), other runners are `run="torch"` (torch from
# C++) and `run="torch"` on its Python path (the forward's Python through the
# native op). The suite's own names (its contenders, the TF program with the
# bridge doing nothing it calls a floor, its classes) stay in the results
# files and in Contributing's pages.

# latest.json's train-step contenders (benchmarks/train_step.py): its
# "torchbridge" is `TorchModule(..., run="torch")` with the C++ runner turned
# off, the Python path: what the bridge itself costs per call.
PYTHON_PATH = '`run="torch"`, Python path'
STEP_ROWS = {
  BRIDGED: f"{PYTHON_PATH}, in a `tf.function`",
  "torchbridge tf.function (tf.py_function path)": (
    f"{PYTHON_PATH}, through `tf.py_function` (no native op)"
  ),
  PURE_TORCH: "pure torch (torch Adam)",
  KERAS: "the Keras port, in a `tf.function`",
  "numpy-copy bridge tf.function": "a bridge that copies through numpy, in a `tf.function`",
  TORCH_FORWARD_BACKWARD: "pure torch, forward and backward only",
  "torchbridge eager": "`tb.TorchModule`, eager calls (torch)",
  "keras eager": "the Keras port, eager",
}
# The suite's "floor:" rows: the same TF program, each bridged call a native
# op whose callback hands its inputs back.
NOTHING = "the same TF program with the bridge doing nothing"
STEP_MODELS = {"small_mlp": "small MLP", "cnn": "CNN", "large_mlp": "large MLP"}
# latest.json's per-call contenders (benchmarks/suite.py's `overhead`).
CALL_ROWS = {
  "tf.function identity": "`tf.identity` in a `tf.function` (no bridge)",
  "tf.py_function identity (in tf.function)": "`tf.py_function` identity (no bridge)",
  "torchbridge identity, tf.py_function path (in tf.function)": (
    "`tb.torch_function` identity through `tf.py_function` (no native op)"
  ),
  "native op doing nothing (in tf.function)": (
    f"{NOTHING}: the native op, its callback handing the input back"
  ),
  "native op doing nothing, in tf.custom_gradient (in tf.function)": (
    "the same inside `tf.custom_gradient`"
  ),
  "native op, torch DLPack round trip only (in tf.function)": (
    "the native op, its callback a DLPack round trip through torch"
  ),
  "native op, torch tensors handed back (in tf.function)": (
    "the native op, its C++ making torch tensors and handing them back"
  ),
  "torchbridge identity, native op (in tf.function)": (
    "`tb.torch_function` identity through the native op"
  ),
  "eager tf.py_function identity": "eager `tf.py_function` identity",
  "eager torchbridge identity": "eager `tb.torch_function` identity",
}
DECOMPOSITION_ROWS = {
  BRIDGED_STEP: f"{PYTHON_PATH}: the step",
  "pure torch step (torch Adam)": "pure torch: the step (torch Adam)",
  "pure torch forward and backward only": "pure torch: forward and backward only",
  "bridged - pure torch: what running it from TF adds": (
    "the step less pure torch's: what running it from TF adds"
  ),
  "bridged - floor: torch's compute and the bridge's own work": (
    f"the step less {NOTHING}: torch's compute and the bridge's own work"
  ),
  "bridged - floor - torch forward and backward: the bridge's own work (hand-overs, "
  "Python) and torch slowed between TF calls": (
    f"the step less {NOTHING} and torch's forward and backward: the bridge's own "
    "work (hand-overs, Python) and torch slowed between TF calls"
  ),
}


def _label(name, labels):
  """A row's label on a user page: `labels`' word for it, the suite's
  "floor:" rows as the same TF program with the bridge doing nothing."""
  if name.startswith("floor:"):
    return f"{NOTHING} (Keras Adam, native ops that hand their inputs back)"
  return labels.get(name, name)


def markdown(results):
  """The costs page's tables from a `make bench` run (latest.json): the
  crossings (`crossings_markdown`), then the steps split into their parts
  (`steps_markdown`). TD3 and the targets are not here: the TD3 step per
  runner is the runners page's (`user_tables.runners_markdown`), the
  targets Contributing's (`targets_markdown`)."""
  return crossings_markdown(results) + "\n" + steps_markdown(results)


def crossings_markdown(results):
  """The exchange and the cost of one call (latest.json)."""
  out = []
  ex = results.get("exchange", {})
  if ex:
    out.append("| a tensor's round trip TF → torch → TF | " + " | ".join(ex) + " |")
    out.append("|---|" + "---|" * len(ex))
    for name, label in (
      ("torchbridge", "`tb.to_tf(tb.to_torch(x))` (DLPack, 0 bytes copied)"),
      ("numpy_copy", "through numpy copies (2x the size copied)"),
    ):
      out.append(
        f"| {label} | "
        + " | ".join(_us(e["timings"][name]["median_us"]) for e in ex.values())
        + " |"
      )
    out.append("")
  if "overhead" in results:
    out.append("| one call of an identity on a 64 x 32 tensor, in a `tf.function` | median |")
    out.append("|---|---|")
    for name, t in results["overhead"].items():
      out.append(f"| {_label(name, CALL_ROWS)} | {_us(t['median_us'])} |")
    out.append("")
  return "\n".join(out).rstrip("\n") + "\n"


# The train steps the costs page splits: what the crossings add to a step,
# at each size. Not a runner comparison (the runners page's, from its own
# side-by-side run): no ratio between rows, and no Keras step in a
# `tf.function` (the runners page's Keras port). The small MLP's step on the
# Python path is stated once, on the runners page: here it is split into
# parts (`decomposition`), and the larger models' steps, which the runners
# page does not time, are shown whole.
SPLIT_STEP_ROWS = tuple(n for n in STEP_ROWS if n != KERAS)
# The model the costs page splits part by part, not shown whole.
SPLIT_MODEL = "small_mlp"
# The small MLP's other bridges, as what each adds over the step it splits.
INSTEAD_ROWS = {
  "torchbridge tf.function (tf.py_function path)": (
    "through `tf.py_function` instead of the native op: what that adds"
  ),
  "numpy-copy bridge tf.function": "a bridge that copies through numpy instead: what that adds",
}


def steps_markdown(results):
  """The steps the costs page splits (latest.json), `run="torch"` on its
  Python path: the larger models' steps whole (`SPLIT_STEP_ROWS`), and the
  small MLP's step part by part, the step itself left out (the runners
  page states each runner's step)."""
  out = []
  steps = {
    m: t for m, t in results.get("train_steps", {}).items() if m in STEP_MODELS and m != SPLIT_MODEL
  }
  if steps:
    rows = []
    for timings in steps.values():
      rows += [c for c in timings if c not in rows and _split_row(c)]
    out.append(
      "| ms per train step, the larger models (median over processes [min-max]) | "
      + " | ".join(STEP_MODELS[m] for m in steps)
      + " |"
    )
    out.append("|---|" + "---|" * len(steps))
    for c in rows:
      cells = []
      for timings in steps.values():
        t = timings.get(c)
        cells.append(
          ""
          if t is None
          else f"{_sig(t['median_us'] / 1e3)} [{_sig(t['min'] / 1e3)}-{_sig(t['max'] / 1e3)}]"
        )
      out.append(f"| {_label(c, STEP_ROWS)} | " + " | ".join(cells) + " |")
    out.append("")
  rows = results.get("decomposition", {}).get(SPLIT_MODEL)
  if rows:
    out.append(
      f"| the small MLP's step, {PYTHON_PATH}, part by part (from medians over processes) | ms |"
    )
    out.append("|---|---|")
    step_ms = None
    for label, ms in rows:
      if label == BRIDGED_STEP:
        step_ms = ms  # the whole the parts split (each runner's step: the runners page's)
        continue
      out.append(f"| {_label(label, DECOMPOSITION_ROWS)} | {ms:.2f} |")
    timings = results.get("train_steps", {}).get(SPLIT_MODEL, {})
    for name, label in INSTEAD_ROWS.items():
      if step_ms is not None and name in timings:
        out.append(f"| {label} | {timings[name]['median_us'] / 1e3 - step_ms:+.2f} |")
    out.append("")
  return "\n".join(out).rstrip("\n") + "\n"


def _split_row(name):
  return name in SPLIT_STEP_ROWS or name.startswith("floor:")


def targets_markdown(results):
  """The targets of a `make bench` run and the same measures taken on the
  suite's other bridges: Contributing's (docs/contributing/measurements.md)."""
  out = []
  if results.get("targets"):
    out.append("| target | measured | met |")
    out.append("|---|---|---|")
    for t in results["targets"]:
      m = t["measured"]
      shown = f"{m:.2f}" if isinstance(m, float) else str(m)
      out.append(f"| {t['name']} ({t['limit']}) | {shown} | {'yes' if t['met'] else '**no**'} |")
  if results.get("floors"):
    out += ["", *floors_markdown(results["floors"])]
  return "\n".join(out) + "\n"


def floors_markdown(records):
  """The `floors` records as a markdown table's lines."""
  out = ["| the same measure, other bridges on the same ops | measured |", "|---|---|"]
  for t in records:
    out.append(f"| {t['name']} ({t['limit']}) | {t['measured']:.2f} |")
  return out


if __name__ == "__main__":
  with open(
    sys.argv[1]
    if len(sys.argv) > 1
    else os.path.join(os.path.dirname(__file__), "results", "latest.json")
  ) as f:
    _results = json.load(f)
  print(markdown(_results))
  print(targets_markdown(_results))
