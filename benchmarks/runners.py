"""Graph calls' runners side by side (issue 40): the TD3 train step and the
small MLP's, each contender in processes of its own, alternated rounds,
in each venv given.

Usage:
  python -m benchmarks.runners --python PY [--python PY2] [--rounds 3]
  python -m benchmarks.runners --one MODEL CONTENDER   (one process)

Contenders: `tb.TorchModule` as users get it (the default `run="auto"`:
its exact TF translation), the same in a step compiled by XLA, with
`run="torch"` (torch through the bridge: the C++ torch runner, and its
Python path; and the C++ torch runner inside a step compiled by XLA), the
Keras port with and without XLA, pure torch as written,
and (TD3) pure torch with the actor's loss differentiated for the actor's
parameters only (as TF's tape asks). Each step runs on random batches
(TD3: Pendulum's shapes, batch 256; MLP: `benchmarks.models`' small MLP).
"call": one forward graph call of Linear(4, 4) on a batch of 1 on each
torch path, against a bare native op whose callback is C++ and computes
nothing (the per-call cost of the torch runner); and under XLA, the bridged
call against that bare op and against the same Linear as TF ops, all three
compiled by XLA. The figure is the median of 7 timed
blocks of about 0.25 s after a warm-up, the first call (tracing, and the
TF runner's capture) timed apart. Writes `results/runners.json` (with the
commit) and `results/runners.md`, which the docs include.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks import train_step  # noqa: E402

TORCHBRIDGE, XLA = "torchbridge", "torchbridge, XLA"
RUN_TORCH = 'torchbridge, run="torch" (C++ torch runner)'
RUN_TORCH_PY = 'torchbridge, run="torch", Python path'
KERAS, KERAS_XLA = "Keras port", "Keras port, XLA"
TORCH, TORCH_ACTOR_ONLY = "pure torch", "pure torch, actor loss for the actor only"
BARE_CPP = "bare op, C++ callback (no torch compute)"
# Torch inside XLA: the bridged call as an XLA custom call (csrc/xla/).
RUN_TORCH_XLA = 'torchbridge, run="torch" (C++ torch runner), XLA'
BARE_CPP_XLA = "bare op, C++ callback (no torch compute), XLA"
TF_OPS_XLA = "TF ops, XLA (the same Linear, no torch)"
# The contenders compiled by XLA, and those that run torch's module.
XLA_NAMES = (XLA, KERAS_XLA, RUN_TORCH_XLA, BARE_CPP_XLA, TF_OPS_XLA)
_TORCH_RUN = (RUN_TORCH, RUN_TORCH_PY, RUN_TORCH_XLA)
CONTENDERS = {
  "td3": (
    TORCHBRIDGE,
    XLA,
    RUN_TORCH,
    RUN_TORCH_PY,
    RUN_TORCH_XLA,
    KERAS,
    KERAS_XLA,
    TORCH,
    TORCH_ACTOR_ONLY,
  ),
  "small_mlp": (TORCHBRIDGE, XLA, RUN_TORCH, RUN_TORCH_PY, RUN_TORCH_XLA, KERAS, KERAS_XLA, TORCH),
  # One forward graph call of Linear(4, 4) on a batch of 1: the torch
  # runner's per-call cost over a bare op whose callback is C++; and under
  # XLA, the bridged call against the same bare op and the same Linear as
  # TF ops, both compiled by XLA.
  "call": (RUN_TORCH, RUN_TORCH_PY, BARE_CPP, RUN_TORCH_XLA, BARE_CPP_XLA, TF_OPS_XLA),
}


def _td3_step(contender):
  sys.path.insert(0, os.path.join(harness.ROOT, "examples"))
  from td3 import agents  # pylint: disable=import-outside-toplevel

  hyper = agents.Hyper()
  if contender in (TORCH, TORCH_ACTOR_ONLY):
    agent = agents.TorchAgent(3, 1, 2.0, 0, hyper)
    if contender == TORCH_ACTOR_ONLY:
      _actor_only(agent)
  else:
    agent = agents.TFAgent(
      "tf" if contender in (KERAS, KERAS_XLA) else "torchbridge",
      3,
      1,
      2.0,
      0,
      hyper,
      run="torch" if contender in _TORCH_RUN else "auto",
      jit_compile=contender in XLA_NAMES,
    )
    if contender == RUN_TORCH_PY:
      for module in (agent.actor, agent.critic, agent.actor_target, agent.critic_target):
        _python_path(module)
  return td3_step_on_batches(agent, as_tf=contender not in (TORCH, TORCH_ACTOR_ONLY))


def td3_step_on_batches(agent, as_tf):
  """A call of `agent.train_step` on the next of 8 random batches of
  Pendulum's shapes (batch `agent.hyper.batch_size`), as TF constants if
  `as_tf`, else as NumPy arrays (the torch agent's)."""
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
    for _ in range(8)
  ]
  if as_tf:
    batches = [tuple(tf.constant(a) for a in b) for b in batches]
  k = iter(range(1 << 62))

  def step():
    return agent.train_step(*batches[next(k) % len(batches)])

  return step


def _actor_only(agent, updates=True):
  """The torch agent's actor update differentiating the actor's loss for
  the actor's parameters only (`torch.autograd.grad`), not the critic's.
  Without `updates`, the optimizers' steps and the target networks'
  updates are left out: the step's forwards and backwards alone."""
  h = agent.hyper
  critic_update = type(agent).train_step
  if not updates:
    agent.critic_opt.step = agent.actor_opt.step = lambda: None

  def train_step(obs, action, reward, next_obs, not_done):
    policy_freq, h.policy_freq = h.policy_freq, 1 << 62  # the critic's part only
    try:
      critic_loss, _ = critic_update(agent, obs, action, reward, next_obs, not_done)
    finally:
      h.policy_freq = policy_freq
    if agent.updates % h.policy_freq == 0:
      obs_t = torch.as_tensor(obs)
      loss = -agent.critic(obs_t, agent.actor(obs_t))[0].mean()
      params = list(agent.actor.parameters())
      for p, g in zip(params, torch.autograd.grad(loss, params)):
        p.grad = g
      agent.actor_opt.step()
      if not updates:
        return critic_loss
      with torch.no_grad():
        for online, target in (
          (agent.actor, agent.actor_target),
          (agent.critic, agent.critic_target),
        ):
          for p, t in zip(online.state_dict().values(), target.state_dict().values()):
            t.mul_(1 - h.tau).add_(h.tau * p)
    return critic_loss

  agent.train_step = train_step


def _mlp_step(contender):
  import torchbridge as tb  # pylint: disable=import-outside-toplevel

  from benchmarks import models  # pylint: disable=import-outside-toplevel

  torch.manual_seed(0)
  shape_torch, _, shape_target = models.batch_shapes("small_mlp")
  rng = np.random.default_rng(0)
  x_np = rng.standard_normal(shape_torch, dtype=np.float32)
  y_np = rng.standard_normal(shape_target, dtype=np.float32)
  if contender == TORCH:
    return train_step._torch_step("small_mlp", x_np, y_np, "cpu", optimizer=True)  # pylint: disable=protected-access
  if contender in (KERAS, KERAS_XLA):
    model = models.keras_model("small_mlp")
  else:
    run = "torch" if contender in _TORCH_RUN else "auto"
    model = tb.TorchModule(models.torch_model("small_mlp"), name="mlp", run=run)
    if contender == RUN_TORCH_PY:
      _python_path(model)
  step = train_step._tf_step(model, tf.constant(x_np), tf.constant(y_np))  # pylint: disable=protected-access
  return tf.function(step, jit_compile=contender in XLA_NAMES or None)


def _python_path(module):
  """`module` with the C++ torch runner turned off (its graph calls run the
  forward's Python, as TORCHBRIDGE_TORCH_RUNNER=python does)."""
  module._runners.torch_runner.enabled = False  # pylint: disable=protected-access
  return module


def _call_step(contender):
  """One forward graph call of Linear(4, 4) on a batch of 1."""
  import torchbridge as tb  # pylint: disable=import-outside-toplevel

  from benchmarks import scripted_native  # pylint: disable=import-outside-toplevel

  torch.manual_seed(0)
  linear = torch.nn.Linear(4, 4)
  x = tf.ones([1, 4])
  if contender == TF_OPS_XLA:
    weight = tf.constant(linear.weight.detach().numpy().T)
    bias = tf.constant(linear.bias.detach().numpy())
    module = lambda v: tf.matmul(v, weight) + bias  # noqa: E731
  elif contender in (BARE_CPP, BARE_CPP_XLA):
    if contender == BARE_CPP_XLA:
      # The XLA kernel of the op, which a bridged call traced under XLA
      # loads itself and the bare op does not.
      from torchbridge._native import _xla  # pylint: disable=import-outside-toplevel

      _xla.load()
    module = scripted_native.NoPythonFloorModule(linear)
  else:
    module = tb.TorchModule(linear, name="linear", run="torch")
    if contender == RUN_TORCH_PY:
      _python_path(module)
  call = tf.function(lambda v: module(v), jit_compile=contender in XLA_NAMES or None)
  return lambda: call(x)


def one(model, contender, threads):
  """Times one contender; returns its JSON record."""
  harness.configure_threads(threads)
  build = {"td3": _td3_step, "small_mlp": _mlp_step, "call": _call_step}[model]
  step = build(contender)
  start = time.perf_counter()
  step()
  first_s = time.perf_counter() - start
  calls = harness.calls_for(step, 0.25)
  summary = harness.summarize(harness.timed_repeats(step, 7, calls))
  from torchbridge._runners import _record as _runners  # pylint: disable=import-outside-toplevel

  return {
    "model": model,
    "contender": contender,
    "median_us": summary["median_us"],
    "samples_us": summary["samples_us"],
    "first_call_s": first_s,
    "runners": _runners.choices(),
    "torch": torch.__version__,
  }


def measure(pythons, rounds, threads, log=print):
  """{python: {model: {contender: {"median_us", "first_call_s", "processes"}}}}."""
  # Only benchmarks/ and examples/ on the path: torchbridge is the venv's.
  with harness.benchmarks_only_path() as path:

    def job(python, model, contender):
      args = ["--one", model, contender, "--threads", threads]
      return lambda: harness.run_process("benchmarks.runners", args, python=python, path=path)

    jobs = {
      (python, model, contender): job(python, model, contender)
      for python in pythons
      for model, names in CONTENDERS.items()
      for contender in names
    }
    runs = harness.alternated(jobs, rounds=rounds, log=lambda m: log(f"  runners {m}"))
  result: dict = {}
  for (python, model, contender), records in runs.items():
    result.setdefault(python, {}).setdefault(model, {})[contender] = {
      "median_us": float(np.median([r["median_us"] for r in records])),
      "first_call_s": float(np.median([r["first_call_s"] for r in records])),
      "torch": records[0]["torch"],
      "runners": records[0]["runners"],
      "processes": records,
    }
  return result


def markdown(data):
  """The committed table: per venv, each model's contenders, ms a step and
  the ratio to the Keras port (same XLA setting) and to pure torch."""
  source = data["source"]
  changed = (
    f", with changes to {', '.join(source['changed_since'])}" if source["changed_since"] else ""
  )
  lines = [
    f"Measured at {source['commit'][:10]}{changed} ({data['rounds']} alternated rounds, "
    f"{data['threads']} threads, each contender in processes of its own; "
    "median of the rounds' medians; random batches).",
    "",
  ]
  for python, models_ in data["venvs"].items():
    torch_version = next(iter(next(iter(models_.values())).values()))["torch"]
    lines += [f"**{venv_name(python)}** (torch {torch_version}):", ""]
    for model, rows in models_.items():
      if model == "call":
        # Under XLA, over the bare op under XLA (where it was measured).
        same_xla = BARE_CPP_XLA in rows
        lines += [
          "| one forward graph call, Linear(4, 4), batch 1 | us | over the bare op"
          + (" (same XLA)" if same_xla else "")
          + ", us |",
          "|---|---|---|",
        ]
        for name, row in rows.items():
          bare = rows[BARE_CPP_XLA if same_xla and name in XLA_NAMES else BARE_CPP]["median_us"]
          lines.append(f"| {name} | {row['median_us']:.1f} | {row['median_us'] - bare:+.1f} |")
        lines.append("")
        continue
      keras, keras_xla, pure = rows[KERAS], rows[KERAS_XLA], rows[TORCH]
      # Both torch baselines where there are two (TD3: the actor's loss for
      # the actor only is what TF's tape asks for).
      actor_only = rows.get(TORCH_ACTOR_ONLY)
      extra = " / pure torch, actor loss for the actor only |" if actor_only else ""
      lines += [
        f"| {model} train step | ms | / Keras port (same XLA) | / pure torch |{extra} first call, s |",
        "|---|---|---|---|" + ("---|" if actor_only else "") + "---|",
      ]
      for name, row in rows.items():
        same = keras_xla if name in XLA_NAMES else keras
        ratio = f" {row['median_us'] / actor_only['median_us']:.2f}x |" if actor_only else ""
        lines.append(
          f"| {name} | {row['median_us'] / 1e3:.2f} | "
          f"{row['median_us'] / same['median_us']:.2f}x | "
          f"{row['median_us'] / pure['median_us']:.2f}x |{ratio} {row['first_call_s']:.2f} |"
        )
      lines.append("")
  return "\n".join(lines)


def venv_name(python):
  return "user-install venv" if ".venv-user" in python else "development venv"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.runners", description=__doc__)
  parser.add_argument("--python", action="append")
  parser.add_argument("--one", nargs=2, metavar=("MODEL", "CONTENDER"))
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--out", default=str(Path(harness.ROOT) / "benchmarks" / "results"))
  args = parser.parse_args(argv)
  if args.one:
    print(json.dumps(one(*args.one, args.threads)))
    return 0
  pythons = [os.path.abspath(p) for p in (args.python or [sys.executable])]
  data = {
    "source": harness.environment(args.threads, "cpu")["source"],
    "rounds": args.rounds,
    "threads": args.threads,
    "venvs": measure(pythons, args.rounds, args.threads),
  }
  harness.write_results(args.out, "runners", data, markdown(data))
  return 0


if __name__ == "__main__":
  sys.exit(main())
