"""Targets, the printed table, the JSON file and the plots."""

import json
import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def _median(timings, name):
  return timings[name]["median_us"]


def targets(results):
  """The issue's targets as {"name", "measured", "limit", "met"} records."""
  out = []

  def add(name, measured, limit, met):
    out.append({"name": name, "measured": measured, "limit": limit, "met": met})

  ex = results.get("exchange", {})
  if "4KB" in ex and "64MB" in ex:
    ratio = (_median(ex["64MB"]["timings"], "torchbridge") /
             _median(ex["4KB"]["timings"], "torchbridge"))
    add("exchange time 64MB / 4KB (torchbridge)", ratio, "<= 2", ratio <= 2)
  if "16MB" in ex:
    t = ex["16MB"]["timings"]
    speedup = _median(t, "numpy_copy") / _median(t, "torchbridge")
    add("exchange speed-up over numpy copy at 16MB", speedup, ">= 100",
        speedup >= 100)
  if ex:
    copied = sum(v["bytes_copied"]["torchbridge"] for v in ex.values())
    add("exchange bytes copied (torchbridge, all sizes)", copied, "== 0",
        copied == 0)
  steps = results.get("train_steps", {})
  for model, limit in (("small_mlp", 1.5), ("large_mlp", 1.1), ("cnn", 1.1)):
    if model in steps:
      t = steps[model]
      ratio = (_median(t, "torchbridge tf.function") /
               _median(t, "keras tf.function"))
      add(f"{model} tf.function step: torchbridge / native Keras", ratio,
          f"<= {limit}", ratio <= limit)
  if "large_mlp" in steps and "numpy-copy bridge tf.function" in steps["large_mlp"]:
    t = steps["large_mlp"]
    speedup = (_median(t, "numpy-copy bridge tf.function") /
               _median(t, "torchbridge tf.function"))
    add("large_mlp tf.function step: speed-up over numpy-copy bridge",
        speedup, ">= 3", speedup >= 3)
  if "overhead" in results:
    t = results["overhead"]
    own = (_median(t, "torchbridge identity, tf.py_function path (in tf.function)") -
           _median(t, "tf.py_function identity (in tf.function)"))
    add("bridge's own overhead per call in tf.function, tf.py_function path "
        "(us over a bare tf.py_function)", own, "<= 30", own <= 30)
    if "native op doing nothing (in tf.function)" in t:
      own = (_median(t, "torchbridge identity, native op (in tf.function)") -
             _median(t, "native op doing nothing (in tf.function)"))
      add("bridge's own overhead per call in tf.function, native op "
          "(us over a bare native op)", own, "<= 10", own <= 10)
      if "small_mlp" in steps:
        ratio = (_median(steps["small_mlp"], "torchbridge tf.function") /
                 _median(steps["small_mlp"], "keras tf.function"))
        add("small_mlp tf.function step with the native op: torchbridge / "
            "native Keras", ratio, "<= 1.0", ratio <= 1.0)
  return out


def table(results):
  lines = []
  for label, entry in results.get("exchange", {}).items():
    t = entry["timings"]
    lines.append(
        f"exchange {label:>6}: torchbridge {_median(t, 'torchbridge'):10.1f} us "
        f"({entry['bytes_copied']['torchbridge']} B copied)   numpy copy "
        f"{_median(t, 'numpy_copy'):10.1f} us "
        f"({entry['bytes_copied']['numpy_copy']} B copied)")
  if "overhead" in results:
    lines.append("")
    lines.append("per-call overhead of an identity:")
    for name, t in results["overhead"].items():
      lines.append(f"  {name:60s} {t['median_us']:9.1f} us "
                   f"[{t['p25_us']:.1f}, {t['p75_us']:.1f}]")
  for model, timings in results.get("train_steps", {}).items():
    lines.append("")
    base = timings["keras tf.function"]["median_us"]
    lines.append(f"training step, {model} (median ms [p25, p75], x native Keras tf.function):")
    for name, t in timings.items():
      lines.append(f"  {name:46s} {t['median_us'] / 1e3:9.2f} ms "
                   f"[{t['p25_us'] / 1e3:.2f}, {t['p75_us'] / 1e3:.2f}]  "
                   f"x{t['median_us'] / base:5.2f}")
  for model, mem in results.get("peak_memory", {}).items():
    lines.append("")
    lines.append(f"peak memory of a training step, {model}:")
    for name, m in mem.items():
      lines.append(f"  {name:12s} +{m['step_peak_mb']:8.1f} MB over "
                   f"{m['rss_before_mb']:.1f} MB resident before the steps")
  lines.append("")
  lines.append("targets:")
  for t in results["targets"]:
    measured = t["measured"]
    shown = f"{measured:.2f}" if isinstance(measured, float) else str(measured)
    lines.append(f"  [{'met' if t['met'] else 'MISSED':6s}] {t['name']}: "
                 f"{shown} (limit {t['limit']})")
  return "\n".join(lines)


def write(results, out_dir):
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "latest.json")
  with open(path, "w") as f:
    json.dump(results, f, indent=1)
  plots = [_plot_exchange(results, out_dir), _plot_steps(results, out_dir)]
  return path, [p for p in plots if p]


def _plot_exchange(results, out_dir):
  ex = results.get("exchange")
  if not ex:
    return None
  labels = list(ex)
  fig, ax = plt.subplots(figsize=(6, 4))
  for name in ("torchbridge", "numpy_copy"):
    ax.plot(labels, [ex[l]["timings"][name]["median_us"] for l in labels],
            marker="o", label=name)
  ax.set_yscale("log")
  ax.set_xlabel("tensor size (float32)")
  ax.set_ylabel("round trip TF -> torch -> TF (us, median)")
  ax.legend()
  ax.set_title("Tensor exchange")
  path = os.path.join(out_dir, "exchange.png")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _plot_steps(results, out_dir):
  steps = results.get("train_steps")
  if not steps:
    return None
  fig, axes = plt.subplots(1, len(steps), figsize=(5 * len(steps), 4.5),
                           squeeze=False)
  for ax, (model, timings) in zip(axes[0], steps.items()):
    names = list(timings)
    ax.barh(names, [timings[n]["median_us"] / 1e3 for n in names],
            xerr=[[(timings[n]["median_us"] - timings[n]["p25_us"]) / 1e3 for n in names],
                  [(timings[n]["p75_us"] - timings[n]["median_us"]) / 1e3 for n in names]])
    ax.set_xlabel("ms per training step (median, p25-p75)")
    ax.set_title(model)
  fig.tight_layout()
  path = os.path.join(out_dir, "train_steps.png")
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
