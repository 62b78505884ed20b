"""TD3's train step with `torch.compile` on the torch side, bridged and not.

`python -m benchmarks.compiled_step [--rounds R] [--out DIR]` times the
TD3 train step of examples/td3/agents.py (Pendulum's shapes, batches of
256, random batches: no environment) for four contenders, each in
processes of its own, the order rotating from round to round:

- `pure torch`: `TorchAgent`, eager modules, torch Adam (the reference);
- `pure torch, compiled`: the same with its four modules compiled
  (`nn.Module.compile()`: inductor, default options);
- `torchbridge`: `TFAgent("torchbridge", run="torch")`, the modules `tb.TorchModule`s (torch through the bridge),
  Keras Adam, the step a `tf.function`;
- `torchbridge, compiled`: the same with each `TorchModule`'s torch module
  compiled (`module.torch_module.compile()`), so the bridged calls run
  inductor's code.

The question it answers (issue 26's stretch): can compiling the torch side
make the bridged step beat pure eager torch, and how does it compare with
compiled pure torch? Writes compiled_step.json and compiled_step.md: the
medians over the rounds, each contender's ratio to pure eager torch, the
compiled bridged step against compiled pure torch, and each process's
first step (tracing and compiling).

Each process also shows that compiled code ran where it should: the
`Torch-Compiled Region` events in torch's profiler over two steps, on
every thread and on the process's own (the bridged calls run on TF's),
and no graph compiled while the step was timed (dynamo's `unique_graphs`
before and after).

`python -m benchmarks.compiled_step --process CONTENDER` runs one process
and prints its JSON line.
"""

import argparse
import itertools
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __name__ == "__main__":  # not in a process that imports this module
  # Graph calls on TF's thread, as examples/td3_pendulum.py runs them (read
  # when torchbridge is imported, below).
  os.environ.setdefault("TORCHBRIDGE_TORCH_THREAD", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before TensorFlow)

from benchmarks import harness  # noqa: E402
from torchbridge._native import _loader  # noqa: E402

# contender: (agent backend, compiled)
CONTENDERS = {
  "pure torch": ("torch", False),
  "pure torch, compiled": ("torch", True),
  "torchbridge": ("torchbridge", False),
  "torchbridge, compiled": ("torchbridge", True),
}
REFERENCE, COMPILED_REFERENCE = "pure torch", "pure torch, compiled"
BATCHES = 16  # random batches made before timing, used in turn
COMPILED_REGION = "Torch-Compiled Region"
THIS_THREAD = "compiled_step: the timing thread"


def _agent(backend, compiled):
  """The TD3 agent and its four torch modules, compiled in place if asked."""
  sys.path.insert(0, os.path.join(harness.ROOT, "examples"))
  from td3 import agents  # pylint: disable=import-outside-toplevel

  hyper = agents.Hyper()
  if backend == "torch":
    agent = agents.TorchAgent(3, 1, 2.0, 0, hyper)
    modules_torch = [agent.actor, agent.critic, agent.actor_target, agent.critic_target]
  else:
    agent = agents.TFAgent("torchbridge", 3, 1, 2.0, 0, hyper, run="torch")
    modules_torch = [
      m.torch_module for m in (agent.actor, agent.critic, agent.actor_target, agent.critic_target)
    ]
  if compiled:
    for module_torch in modules_torch:
      module_torch.compile()
  return agent


def _counter(group, name):
  """One of dynamo's counters in this process (0 before dynamo is loaded)."""
  dynamo = sys.modules.get("torch._dynamo")
  return int(dynamo.utils.counters[group][name]) if dynamo else 0


def _graphs_compiled():
  """Dynamo's count of graphs compiled in this process."""
  return _counter("stats", "unique_graphs")


def _compiled_regions(step, steps=2):
  """`Torch-Compiled Region` events per step in torch's profiler, on every
  thread, and how many of them ran on the calling thread (the bridged
  calls run on TF's)."""
  config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)  # pylint: disable=protected-access
  with torch.profiler.profile(experimental_config=config) as prof:
    with torch.profiler.record_function(THIS_THREAD):  # torch's id for this thread
      pass
    for _ in range(steps):
      step()
  [this_thread] = {e.thread for e in prof.events() if e.name == THIS_THREAD}
  regions = [e for e in prof.events() if e.name.startswith(COMPILED_REGION)]
  here = sum(e.thread == this_thread for e in regions)
  return len(regions) / steps, here / steps


def run_contender(name, threads, calls=0, repeats=7):
  """One contender's step, timed in this process: the first step (tracing,
  compiling), a warm-up of ~0.5 s, then `repeats` timings of `calls` steps
  (0: as many as take ~0.25 s). Returns the process's record."""
  harness.configure_threads(threads)
  backend, compiled = CONTENDERS[name]
  agent = _agent(backend, compiled)
  rng = np.random.default_rng(0)
  n = agent.hyper.batch_size
  batches = [
    (
      rng.standard_normal((n, 3), dtype=np.float32),
      rng.uniform(-2, 2, (n, 1)).astype(np.float32),
      rng.standard_normal((n, 1), dtype=np.float32),
      rng.standard_normal((n, 3), dtype=np.float32),
      np.ones((n, 1), np.float32),
    )
    for _ in range(BATCHES)
  ]
  in_turn = itertools.cycle(batches)

  def step():  # as the script calls it: numpy batches in, the losses fetched
    return tuple(float(v) for v in agent.train_step(*next(in_turn)))

  start = time.perf_counter()
  step()
  first_step_s = time.perf_counter() - start
  warm_calls = harness.calls_for(step, 0.5, min_warmup=4)  # the actor's update every 2nd
  graphs_before = _graphs_compiled()
  samples_us = harness.timed_repeats(step, repeats, calls or max(2, warm_calls // 2))
  graphs_after = _graphs_compiled()
  regions, regions_here = _compiled_regions(step)
  return {
    "pid": os.getpid(),
    "contender": name,
    "ms_per_step": float(np.median(samples_us)) / 1e3,
    "samples_ms": [v / 1e3 for v in samples_us],
    "first_step_s": first_step_s,
    "graphs_compiled": graphs_after,
    "graphs_compiled_while_timed": graphs_after - graphs_before,
    "compiled_regions_per_step": regions,
    "compiled_regions_per_step_on_this_thread": regions_here,
    # The first step compiles; inductor's on-disk caches make it faster
    # in later processes (a user's second run): how many graphs it found.
    "inductor_cache_hits": _counter("inductor", "fxgraph_cache_hit"),
    "inductor_cache_misses": _counter("inductor", "fxgraph_cache_miss"),
    "torch": torch.__version__,
    "native_op_complete": bool(_loader.available()),
    "threads": threads,
    # Where graph calls ran: "0", TF's thread, as the TD3 script has them.
    "torch_thread": os.environ.get("TORCHBRIDGE_TORCH_THREAD"),
  }


def measure(rounds, threads, log=print, **process_args):
  """{contender: {"ms_per_step": median over its processes, "min", "max",
  "first_step_s" (median), "processes": records}}."""
  extra = [str(a) for k, v in process_args.items() for a in (f"--{k}", v)]
  runs = harness.alternated(
    {
      name: (
        lambda name=name: harness.run_process(
          "benchmarks.compiled_step", ["--process", name, "--threads", threads, *extra]
        )
      )
      for name in CONTENDERS
    },
    rounds=rounds,
    log=lambda m: log(f"  compiled TD3 step {m}"),
  )
  return {
    name: harness.over_processes(records, "ms_per_step")
    | {"first_step_s": float(np.median([r["first_step_s"] for r in records]))}
    for name, records in runs.items()
  }


def ratios(result):
  """The ratios the table shows: each contender over pure eager torch, and
  the compiled bridged step over compiled pure torch and over the eager
  bridged step (medians over processes)."""
  ms = {name: result[name]["ms_per_step"] for name in result}
  out = {f"{name} / {REFERENCE}": ms[name] / ms[REFERENCE] for name in CONTENDERS}
  out[f"torchbridge, compiled / {COMPILED_REFERENCE}"] = (
    ms["torchbridge, compiled"] / ms[COMPILED_REFERENCE]
  )
  out["torchbridge, compiled / torchbridge"] = ms["torchbridge, compiled"] / ms["torchbridge"]
  return out


def markdown(result, rounds):
  reference = result[REFERENCE]["ms_per_step"]
  lines = [
    f"TD3 train step, torch.compile on the torch side (random batches of 256; "
    f"median of {rounds} alternated rounds, a process per contender)",
    "",
    "| contender | ms a step [min-max] | / pure eager torch | first step (s) "
    "| compiled regions a step |",
    "|---|---|---|---|---|",
  ]
  for name in CONTENDERS:
    r = result[name]
    regions = np.median([p["compiled_regions_per_step"] for p in r["processes"]])
    lines.append(
      f"| {name} | {r['ms_per_step']:.2f} [{r['min']:.2f}-{r['max']:.2f}] "
      f"| {r['ms_per_step'] / reference:.2f}x | {r['first_step_s']:.2f} | {regions:g} |"
    )
  lines.append("")
  for label, value in ratios(result).items():
    if not label.startswith(f"{REFERENCE} /"):
      lines.append(f"- {label}: {value:.2f}x")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.compiled_step", description=__doc__)
  parser.add_argument("--process", choices=CONTENDERS, help="run one contender, print its JSON")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--calls", type=int, default=0, help="steps per timing; 0: ~0.25 s")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = parser.parse_args(argv)
  if args.process:
    print(json.dumps(run_contender(args.process, args.threads, args.calls, args.repeats)))
    return
  result = measure(args.rounds, args.threads, calls=args.calls, repeats=args.repeats)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "compiled_step.json"), "w") as f:
    json.dump(
      {
        "rounds": args.rounds,
        "environment": harness.environment(args.threads, "cpu"),
        "contenders": result,
        "ratios": ratios(result),
      },
      f,
      indent=1,
    )
  text = markdown(result, args.rounds)
  with open(os.path.join(args.out, "compiled_step.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
