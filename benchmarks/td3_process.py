"""The TD3 train step of one backend, timed in a process of its own.

Usage:
  python -m benchmarks.td3_process
      {torchbridge,torchbridge-torch,torchbridge-torch-python,torch,tf,floor,
       floor-script,lean-script,scripted-script} --out DIR
      [--steps N] [--start-steps M] [--threads T] [--torch-thread on|off]
      [--policy function|eager]

`torchbridge`, `torch` and `tf` run examples/td3_pendulum.py's own main
(`torchbridge`: the default `tb.TorchModule`, graph calls on the TF
runner, its exact translation; `torchbridge-torch`: `--run torch`, graph
calls through the bridge on the C++ torch runner; `torchbridge-torch-python`:
the same on the torch runner's Python path)
(same loop, environment, replay buffer and timing window as a user's run,
evaluation and checkpoints only at the end) with a hook that records each
train step's time: the script's `sec_per_train_step` is a mean that
includes the first step, which traces the TF backends' `tf.function` (a
second or more), so the figure compared here is the mean over the steps
after the first `WARM_STEPS`; the script's own figure is kept beside it.

`floor` is the torchbridge backend's train step with every
`tb.TorchModule` replaced by a `BareNativeModule` (same variables; each
forward and backward a bare native op, no torch): the TF program around
the bridged calls (the step's graph, Keras Adam, Polyak `assign`s, the
ops' crossing), timed the same way on random batches.

`floor-script` runs the script as `torchbridge` does, with the agent's four
modules `BareNativeModule(torch_outputs=True)` (the policy's calls and the
train steps then cost what they cost with no torch compute and no bridge
Python), and then times, in the same process, the torch compute that the
bridged run adds to it (`torch_compute`): the actor's forward on one
observation, as a policy call runs it, and the module forwards and
backwards of one train step, as the bridged step runs them. The floor's
wall time plus that compute is what no bridge can go below.

`lean-script` runs the script with the four modules
`bare_native.LeanTorchModule`s: the torch modules through the leanest
Python bridge on the same native op (none of torchbridge's Python).
`scripted-script` runs it with `scripted_native.ScriptedTorchModule`s: the
torch modules captured with torch.export and run from the op's kernel in C++
(no Python per call at all).

Prints one JSON line: the per-step mean, the process id, the step counts,
and the script's wall time split (`wall_split`, seconds): the first policy
call and the first train step (tracing, for the TF backends), the other
policy calls (the per-environment-step `act`, and the final evaluation's),
the other train steps, and the rest (environment, replay buffer, summaries,
building the agent, the checkpoint at the end).
"""

import argparse
import contextlib
import copy
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch  # noqa: E402  (before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import torchbridge  # noqa: E402
from torchbridge._native import _callbacks  # noqa: E402
from torchbridge._native import _loader  # noqa: E402
from benchmarks import bare_native  # noqa: E402
from benchmarks import scripted_native  # noqa: E402
from benchmarks import harness  # noqa: E402

EXAMPLES = os.path.join(harness.ROOT, "examples")
sys.path.insert(0, EXAMPLES)
from td3 import agents  # noqa: E402

WARM_STEPS = 10


def _timed(train_step, durations):
  """`train_step` plus the loss fetch the script times with it, recorded."""

  def timed(*batch):
    start = time.perf_counter()
    losses = tuple(float(v) for v in train_step(*batch))
    durations.append(time.perf_counter() - start)
    return losses

  return timed


def _timed_policy(policy, durations):
  """`policy` (numpy in, numpy out), each call's time recorded."""

  def timed(obs):
    start = time.perf_counter()
    action = policy(obs)
    durations.append(time.perf_counter() - start)
    return action

  return timed


def wall_split(wall_s, train_durations, policy_durations):
  """The script's wall time in parts that add up to it (seconds)."""
  first_policy = policy_durations[0] if policy_durations else 0.0
  first_train = train_durations[0] if train_durations else 0.0
  policy = float(np.sum(policy_durations)) - first_policy
  train = float(np.sum(train_durations)) - first_train
  return {
    "first policy call": first_policy,
    "first train step": first_train,
    "policy calls": policy,
    "train steps": train,
    "the rest": wall_s - first_policy - first_train - policy - train,
  }


def run_script(
  backend,
  out,
  steps,
  start_steps,
  threads,
  policy_durations=None,
  modules=None,
  eager_policy=False,
  run="auto",
  jit_compile=False,
):
  """examples/td3_pendulum.py's main, each train step (and, given a list,
  each policy call) timed; with `modules` ("bare", "lean" or "scripted"), on
  `bare_native_agent`'s modules of that kind; `run`, the script's `--run`;
  with `eager_policy`, a TF agent's policy calls its
  actor eagerly instead of through its `tf.function` `act`.
  Returns the train steps' durations, the script's mean, the agent's
  actor's class name and how many times a TF agent's `act` was traced
  (None for pure torch)."""
  # The script (and Gymnasium, which the user venv lacks) only here: the
  # agents built below need neither.
  import td3_pendulum  # pylint: disable=import-outside-toplevel

  durations, actor_class, act_functions = [], [], []
  script_run = td3_pendulum.Run

  class TimedRun(script_run):
    def __init__(self, args):
      super().__init__(args)
      if modules:
        bare = bare_native_agent(seed=args.seed, torch_outputs=True, kind=modules)
        for name in ("actor", "critic", "actor_target", "critic_target"):
          setattr(self.agent, name, getattr(bare, name))
        self.agent.actor_opt, self.agent.critic_opt = bare.actor_opt, bare.critic_opt
      if isinstance(self.agent, agents.TFAgent):
        act_functions.append(self.agent.act)
        if eager_policy:
          # The policy calls act's concrete function once it has one: give
          # it the undecorated act instead, so no trace is ever made.
          self.agent._act_concrete = self.agent._act  # pylint: disable=protected-access
      actor_class.append(type(self.agent.actor).__name__)
      self.agent.train_step = _timed(self.agent.train_step, durations)
      if policy_durations is not None:
        self.agent.policy = _timed_policy(self.agent.policy, policy_durations)

  td3_pendulum.Run = TimedRun
  try:
    with contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON line only
      td3_pendulum.main(
        [
          "--backend",
          backend,
          "--steps",
          str(steps),
          "--start-steps",
          str(start_steps),
          "--eval-every",
          str(10 * steps),
          "--checkpoint-every",
          str(10 * steps),
          "--threads",
          str(threads),
          "--out",
          out,
          *(["--run", run] if backend == "torchbridge" else []),
          # The per-step schedule, the policy through its tf.function: what
          # this benchmark has timed since before the burst schedule.
          "--schedule",
          "step",
          *(["--policy-call", "function"] if backend != "torch" else []),
          *(["--jit-compile"] if jit_compile else []),
        ]
      )
  finally:
    td3_pendulum.Run = script_run
  with open(os.path.join(out, "results.json")) as f:
    script = json.load(f)
  act_traces = act_functions[0].experimental_get_tracing_count() if act_functions else None
  return durations, script["sec_per_train_step"], actor_class[0], act_traces


def bare_native_agent(seed=0, torch_outputs=False, kind="bare"):
  """The torchbridge TD3 agent with its four modules bare native modules
  (`torch_outputs`: see `bare_native.BareNativeModule`); with `kind`
  "lean", `bare_native.LeanTorchModule`s (the torch modules run by the
  leanest Python bridge); with "scripted",
  `scripted_native.ScriptedTorchModule`s (captured, run from C++); with
  "no-python-floor", `scripted_native.NoPythonFloorModule`s (bare ops whose
  callbacks are C++)."""
  hyper = agents.Hyper()
  agent = agents.TFAgent("torchbridge", 3, 1, 2.0, seed, hyper)
  actor_torch, critic_torch = agents.torch_networks(3, 1, 2.0, seed)

  def bare(module_torch, name):
    if kind == "lean":
      return bare_native.LeanTorchModule(copy.deepcopy(module_torch), name)
    if kind == "scripted":
      return scripted_native.ScriptedTorchModule(copy.deepcopy(module_torch), name)
    if kind == "no-python-floor":
      return scripted_native.NoPythonFloorModule(module_torch, name)
    return bare_native.BareNativeModule(module_torch, name, torch_outputs=torch_outputs)

  agent.actor = bare(actor_torch, "actor")
  agent.critic = bare(critic_torch, "critic")
  agent.actor_target = bare(actor_torch, "actor_target")
  agent.critic_target = bare(critic_torch, "critic_target")
  agent.actor_opt = tf.keras.optimizers.Adam(hyper.lr)
  agent.critic_opt = tf.keras.optimizers.Adam(hyper.lr)
  agent.actor_opt.build(agent.actor.trainable_variables)
  agent.critic_opt.build(agent.critic.trainable_variables)
  return agent


def run_floor(train_steps, threads):
  """The bare-native TD3 step on random batches (Pendulum's shapes)."""
  torch.set_num_threads(threads)
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  os.environ.setdefault("TORCHBRIDGE_TORCH_THREAD", "0")  # as the script
  agent = bare_native_agent()
  rng = np.random.default_rng(0)
  n = agent.hyper.batch_size
  durations = []
  step = _timed(agent.train_step, durations)
  for _ in range(train_steps):
    step(
      rng.standard_normal((n, 3), dtype=np.float32),
      rng.uniform(-2, 2, (n, 1)).astype(np.float32),
      rng.standard_normal((n, 1), dtype=np.float32),
      rng.standard_normal((n, 3), dtype=np.float32),
      np.ones((n, 1), np.float32),
    )
  return durations


def torch_compute(batch_size, calls=100, rounds=5):
  """The torch compute a bridged TD3 run adds to its floor, timed here on
  the torch modules themselves (medians of `rounds` blocks of `calls`):

  - `policy_call_us`: the actor's forward on one observation, no grad;
  - `train_step_ms`: one train step's forwards and backwards, averaged
    over an update step and a step without one (the actor's update runs
    every second step): the target actor and critic forwards (no grad),
    the critic's forward and its backward to its parameters, and, on an
    update step, the actor's and the critic's forwards and the backward
    through both to the actor's parameters (`torch.autograd.grad`, as the
    bridge's backward computes only what the tape asks for).
  """
  actor, critic = agents.torch_networks(3, 1, 2.0, 0)
  actor_target, critic_target = agents.torch_networks(3, 1, 2.0, 1)
  rng = np.random.default_rng(0)
  obs = torch.from_numpy(rng.standard_normal((batch_size, 3), dtype=np.float32))
  action = torch.from_numpy(rng.uniform(-2, 2, (batch_size, 1)).astype(np.float32))
  one_obs = obs[:1].clone()
  critic_params, actor_params = list(critic.parameters()), list(actor.parameters())

  def policy_call():
    with torch.no_grad():
      actor(one_obs)

  def train_step_pair():
    for update in (False, True):
      with torch.no_grad():
        critic_target(obs, actor_target(obs))
      q1, q2 = critic(obs, action)
      torch.autograd.grad((q1, q2), critic_params, (torch.ones_like(q1), torch.ones_like(q2)))
      if update:
        q1, _ = critic(obs, actor(obs))
        torch.autograd.grad(q1, actor_params, torch.ones_like(q1))

  def median_block(fn):
    blocks = []
    for _ in range(rounds):
      fn()
      start = time.perf_counter()
      for _ in range(calls):
        fn()
      blocks.append((time.perf_counter() - start) / calls)
    return float(np.median(blocks))

  return {
    "policy_call_us": 1e6 * median_block(policy_call),
    "train_step_ms": 1e3 * median_block(train_step_pair) / 2,
  }


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.td3_process", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument(
    "backend",
    choices=[
      "torchbridge",
      "torchbridge-torch",
      "torchbridge-torch-python",
      "torch",
      "tf",
      "floor",
      "floor-script",
      "lean-script",
      "scripted-script",
    ],
  )
  parser.add_argument("--out", required=True, help="the script's run directory")
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--start-steps", type=int, default=1000)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument(
    "--jit-compile",
    action="store_true",
    help="TF backends: the script's --jit-compile (the train step compiled by XLA)",
  )
  parser.add_argument(
    "--torch-thread",
    choices=["script", "on", "off"],
    default="script",
    help="where graph calls run (TORCHBRIDGE_TORCH_THREAD): "
    "as the script chooses (TF's thread), or set here",
  )
  parser.add_argument(
    "--policy",
    choices=["function", "eager"],
    default="function",
    help="a TF agent's policy call: through its tf.function (as the script), or eager",
  )
  args = parser.parse_args(argv)
  if args.policy == "eager" and args.backend in ("torch", "floor"):
    parser.error(
      f"--policy eager: the {args.backend} backend has no tf.function policy; "
      "use --policy function, or a TF backend (torchbridge, tf, floor-script, lean-script)"
    )
  if args.torch_thread != "script":
    os.environ["TORCHBRIDGE_TORCH_THREAD"] = {"on": "1", "off": "0"}[args.torch_thread]

  script_mean, wall_s, split, policy_durations, actor_class = None, None, None, [], None
  act_traces = None
  compute, compute_s = None, 0.0
  if args.backend == "floor":
    durations = run_floor(args.steps - args.start_steps, args.threads)
  else:
    modules = {"floor-script": "bare", "lean-script": "lean", "scripted-script": "scripted"}.get(
      args.backend
    )
    start = time.perf_counter()
    torch_runner = args.backend in ("torchbridge-torch", "torchbridge-torch-python")
    if args.backend == "torchbridge-torch-python":
      os.environ["TORCHBRIDGE_TORCH_RUNNER"] = "python"
    bridged = modules or torch_runner
    durations, script_mean, actor_class, act_traces = run_script(
      "torchbridge" if bridged else args.backend,
      args.out,
      args.steps,
      args.start_steps,
      args.threads,
      policy_durations,
      modules=modules,
      eager_policy=args.policy == "eager",
      run="torch" if torch_runner else "auto",
      jit_compile=args.jit_compile,
    )
    wall_s = time.perf_counter() - start
    split = wall_split(wall_s, durations, policy_durations)
    if modules == "bare":
      start = time.perf_counter()
      compute = torch_compute(agents.Hyper().batch_size)
      compute_s = time.perf_counter() - start
  warm = durations[WARM_STEPS:]
  print(
    json.dumps(
      {
        "pid": os.getpid(),
        "backend": args.backend,
        "jit_compile": args.jit_compile,
        "train_steps": len(durations),
        "ms_per_train_step": 1e3 * float(np.mean(warm)),
        "first_step_ms": 1e3 * durations[0],
        # The script's whole run (environment steps, the policy's calls,
        # the train steps, the final evaluation), as `make demo` runs it.
        "wall_s": wall_s,
        # `wall_s` again: `harness.run_process` replaces `wall_s` with the
        # whole process's (Python's start, the imports, the exit included).
        "script_wall_s": wall_s,
        "wall_split": split,
        "policy_calls": len(policy_durations),
        "policy_call_median_us": (
          1e6 * float(np.median(policy_durations[1:])) if len(policy_durations) > 1 else None
        ),
        # Where its graph calls ran (TORCHBRIDGE_TORCH_THREAD, "0": TF's
        # thread), as the script or --torch-thread left it.
        "torch_thread": os.environ.get("TORCHBRIDGE_TORCH_THREAD"),
        "policy": args.policy,
        "act_traces": act_traces,
        "script_ms_per_train_step": (None if script_mean is None else 1e3 * script_mean),
        # floor-script: torch's compute for a policy call and a train step,
        # and the seconds its timing took (in the process's wall time).
        "torch_compute": compute,
        "actor_class": actor_class,
        # What this process ran on (`benchmarks.td3_venvs` runs it in venvs).
        "torch": torch.__version__,
        "torchbridge_file": torchbridge.__file__,
        "native_op_complete": _loader.has_torch_interop(),
        # C++ callbacks registered at the end: above 0 where graph calls
        # ran from C++ (the C++ torch runner, the no-Python bridge).
        "cpp_callbacks": _callbacks.native_count(),
        "torch_compute_s": compute_s,
      }
    )
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
