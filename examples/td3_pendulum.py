"""TD3 on gymnasium's Pendulum-v1: a torch actor-critic in a TF RL loop.

The main job of torchbridge: torch networks (actor, twin-Q critic, 256-256
as in the TD3 paper's reference code) wrapped in `tb.TorchModule`, trained by
Keras Adam, target networks updated by Polyak averaging with TF `assign`,
trained in bursts as the RL Zoo schedules TD3 on Pendulum (10,000 random
steps, then after each episode as many train steps as it had steps, all
in one graph call: the replay buffer mirrored in TF variables, batches
drawn in a `tf.while_loop`), the policy called as the torch module itself
(torch's cost, on views of the trained variables), checkpointed by
`tf.train.CheckpointManager`,
logged to TensorBoard with `tf.summary`. The same algorithm runs in pure
PyTorch (`--backend torch`) and in Keras layers (`--backend tf`), from the
same initial weights, for comparison.

  python examples/td3_pendulum.py --backend torchbridge --steps 20000 \
      --seed 0 --out runs/td3/torchbridge_s0

A killed run started again with the same --out resumes from its last
checkpoint (networks, optimizers, replay buffer, counters). Writes
DIR/results.json, DIR/learning_curve.png (every run found beside DIR),
DIR/checkpoints/ and DIR/tensorboard/.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TF's C++ logs

import torch  # noqa: E402  (first, the recommended order: docs/troubleshooting.md, "Does the import order matter?")
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchbridge as tb  # noqa: E402
from td3 import agents  # noqa: E402
from td3 import export  # noqa: E402
from td3 import replay  # noqa: E402
from td3 import reporting  # noqa: E402

BACKENDS = ("torchbridge", "torch", "tf")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--backend", choices=BACKENDS, default="torchbridge")
  p.add_argument("--steps", type=int, default=20000, help="environment steps")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True, help="run directory")
  p.add_argument(
    "--start-steps",
    type=int,
    default=10000,
    help="steps of uniform random actions before the policy acts and training "
    "starts (the RL Zoo's learning_starts for Pendulum)",
  )
  p.add_argument("--gamma", type=float, default=agents.Hyper.gamma, help="discount")
  p.add_argument("--lr", type=float, default=agents.Hyper.lr, help="Adam's learning rate")
  p.add_argument("--eval-every", type=int, default=2000)
  p.add_argument("--eval-episodes", type=int, default=5)
  p.add_argument("--checkpoint-every", type=int, default=2000)
  p.add_argument("--threads", type=int, default=2, help="threads for each framework's kernels")
  p.add_argument(
    "--run",
    choices=("auto", "tf", "torch"),
    default="auto",
    help="torchbridge backend: the runner of the modules' graph calls "
    "(tb.TorchModule(run=...)): auto (default) their exact TF translation "
    "where it holds, tf (or an error), torch (torch through the bridge: "
    "from C++, a torch.export capture of each)",
  )
  p.add_argument(
    "--jit-compile",
    action="store_true",
    help="TF backends: compile the train step and the policy's call with XLA "
    "(tf.function(jit_compile=True))",
  )
  p.add_argument(
    "--schedule",
    choices=("burst", "step"),
    default="burst",
    help="burst (default, as the RL Zoo schedules TD3): after each episode, as many "
    "train steps as environment steps it collected, for the TF backends in one graph "
    "call (the replay buffer in TF variables, the batches drawn in the graph); step: "
    "one train step after each environment step, a graph call each",
  )
  p.add_argument(
    "--policy-call",
    choices=("auto", "torch", "function"),
    default="auto",
    help="the policy's call each environment step: auto (torch for the torchbridge "
    "backend, function for tf), torch (the torch actor's own eager call, "
    "actor.torch_module), function (the actor through a tf.function)",
  )
  p.add_argument(
    "--export",
    action="store_true",
    help="torchbridge backend: at the end, translate the actor to "
    "TF ops (tb.translate), save it as a SavedModel and serve "
    "it in a process without torch (DIR/actor_savedmodel)",
  )
  args = p.parse_args(argv)
  if args.run != "auto" and args.backend != "torchbridge":
    p.error(f"--run is for the torchbridge backend, not --backend {args.backend}")
  if args.policy_call != "auto" and args.backend == "torch":
    p.error("--policy-call is for the TF backends, not --backend torch")
  if args.policy_call == "torch" and args.backend != "torchbridge":
    p.error(f"--policy-call torch is for the torchbridge backend, not --backend {args.backend}")
  return args


def _runners_taken():
  with tb.timeline(annotate=False) as seen:
    pass
  return seen.runners


class Run:
  """One training run: agent, replay buffer, counters, checkpoints."""

  def __init__(self, args):
    self.args = args
    self.env = gym.make("Pendulum-v1")
    self.eval_env = gym.make("Pendulum-v1")
    obs_dim = self.env.observation_space.shape[0]
    act_dim = self.env.action_space.shape[0]
    self.max_action = float(self.env.action_space.high[0])
    self.hyper = agents.Hyper(gamma=args.gamma, lr=args.lr)
    if args.backend == "torch":
      self.agent = agents.TorchAgent(obs_dim, act_dim, self.max_action, args.seed, self.hyper)
    else:
      self.agent = agents.TFAgent(
        args.backend,
        obs_dim,
        act_dim,
        self.max_action,
        args.seed,
        self.hyper,
        run=args.run,
        jit_compile=args.jit_compile,
        capacity=max(args.steps, 1) if args.schedule == "burst" else None,
        policy_call=args.policy_call,
      )
      self.tf_checkpoint = tf.train.CheckpointManager(
        tf.train.Checkpoint(**self.agent.checkpoint_items()),
        os.path.join(args.out, "checkpoints"),
        max_to_keep=2,
      )
    self.buffer = replay.ReplayBuffer(obs_dim, act_dim, capacity=max(args.steps, 1))
    self.rng = np.random.default_rng(args.seed)
    self.progress = {
      "env_step": 0,
      "episodes": 0,
      "eval_returns": [],
      "train_steps": 0,
      "train_seconds": 0.0,
      "train_calls": 0,
      # Environment steps since the start steps not yet trained on (the
      # burst schedule trains on them at the episode's end).
      "untrained_steps": 0,
      "resumed_from": None,
    }
    # This process's time in the policy's calls (exploration and
    # evaluation) and in the first call and train step (their tracing,
    # captures and compiles): not checkpointed, as the wall time is not.
    self.timing = {
      "policy_calls": 0,
      "policy_seconds": 0.0,
      "first_policy_call_s": None,
      "first_train_step_s": None,
    }

  # --- checkpoints -----------------------------------------------------
  def _progress_path(self):
    return os.path.join(self.args.out, "checkpoints", "progress.json")

  def save(self):
    step = self.progress["env_step"]
    ckpt_dir = os.path.join(self.args.out, "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    if self.args.backend == "torch":
      torch.save(self.agent.state_dict(), os.path.join(ckpt_dir, f"torch-{step}.pt"))
    else:
      self.tf_checkpoint.save(checkpoint_number=step)
    self.buffer.save(os.path.join(ckpt_dir, f"replay-{step}.npz"))
    state = dict(self.progress, rng=self.rng.bit_generator.state)
    tmp = self._progress_path() + ".tmp"
    with open(tmp, "w") as f:
      json.dump(state, f)
    os.replace(tmp, self._progress_path())  # the checkpoint counts from here
    for name in os.listdir(ckpt_dir):  # keep the replay buffers of the last two
      if name.startswith(("replay-", "torch-")):
        if int(name.split("-")[1].split(".")[0]) < step - self.args.checkpoint_every:
          os.remove(os.path.join(ckpt_dir, name))

  def restore(self):
    """Continues from the last complete checkpoint, if there is one."""
    if not os.path.exists(self._progress_path()):
      return False
    with open(self._progress_path()) as f:
      state = json.load(f)
    step = state["env_step"]
    ckpt_dir = os.path.join(self.args.out, "checkpoints")
    if self.args.backend == "torch":
      self.agent.load_state_dict(
        torch.load(os.path.join(ckpt_dir, f"torch-{step}.pt"), weights_only=False)
      )
    else:
      path = os.path.join(ckpt_dir, f"ckpt-{step}")
      self.tf_checkpoint.checkpoint.restore(path).assert_consumed()
    self.buffer.load(os.path.join(ckpt_dir, f"replay-{step}.npz"))
    self.rng.bit_generator.state = state.pop("rng")
    self.progress = dict(state, resumed_from=step)
    return True

  # --- learning --------------------------------------------------------
  def train(self, steps):
    """`steps` train steps (one graph call for a TF agent's burst); returns
    the last critic and actor losses (the actor's NaN when it was not
    updated)."""
    start = time.perf_counter()
    if steps == 1 and self.args.schedule == "step":
      critic_loss, actor_loss = self.agent.train_step(
        *self.buffer.sample(self.rng, self.hyper.batch_size)
      )
    elif self.args.backend == "torch":
      actor_loss = float("nan")
      for _ in range(steps):
        critic_loss, loss = self.agent.train_step(
          *self.buffer.sample(self.rng, self.hyper.batch_size)
        )
        actor_loss = actor_loss if np.isnan(loss) else loss
    else:
      self.agent.replay.sync_from(self.buffer)
      critic_loss, actor_loss = self.agent.train_burst(tf.constant(steps, tf.int32))
    critic_loss, actor_loss = float(critic_loss), float(actor_loss)
    seconds = time.perf_counter() - start
    progress = self.progress
    progress["train_seconds"] += seconds
    if self.timing["first_train_step_s"] is None:
      self.timing["first_train_step_s"] = seconds
    progress["train_steps"] += steps
    progress["train_calls"] += 1
    return critic_loss, actor_loss

  # --- acting ----------------------------------------------------------
  def policy(self, obs):
    start = time.perf_counter()
    action = self.agent.policy(obs)
    seconds = time.perf_counter() - start
    timing = self.timing
    if timing["first_policy_call_s"] is None:
      timing["first_policy_call_s"] = seconds
    timing["policy_calls"] += 1
    timing["policy_seconds"] += seconds
    return action

  def explore(self, obs):
    if self.progress["env_step"] < self.args.start_steps:
      return self.rng.uniform(-self.max_action, self.max_action, size=1).astype(np.float32)
    noise = self.rng.normal(0, self.max_action * self.hyper.expl_noise, size=1)
    return np.clip(self.policy(obs) + noise, -self.max_action, self.max_action).astype(np.float32)

  def evaluate(self):
    returns = []
    for k in range(self.args.eval_episodes):
      obs, _ = self.eval_env.reset(seed=10_000 + 100 * self.args.seed + k)
      done, total = False, 0.0
      while not done:
        obs, reward, terminated, truncated, _ = self.eval_env.step(
          self.policy(obs.astype(np.float32))
        )
        total += reward
        done = terminated or truncated
      returns.append(total)
    return float(np.mean(returns))


def train(args):
  tb.reset_exchange_stats()
  run = Run(args)
  resumed = run.restore()
  writer = tf.summary.create_file_writer(os.path.join(args.out, "tensorboard"))
  bar = reporting.ProgressBar(args.steps, start=run.progress["env_step"])
  if resumed:
    print(f"resuming from checkpoint at step {run.progress['env_step']}", flush=True)
  obs, _ = run.env.reset(seed=args.seed + 1000 * run.progress["episodes"])
  obs = obs.astype(np.float32)
  episode_return, last_return, last_eval = 0.0, None, None
  window_start, window_step = time.time(), run.progress["env_step"]
  wall_start = time.time()
  with writer.as_default():
    while run.progress["env_step"] < args.steps:
      step = run.progress["env_step"]
      action = run.explore(obs)
      next_obs, reward, terminated, truncated, _ = run.env.step(action)
      next_obs = next_obs.astype(np.float32)
      run.buffer.add(obs, action, reward, next_obs, terminated)
      obs, episode_return = next_obs, episode_return + float(reward)
      if step >= args.start_steps:
        run.progress["untrained_steps"] += 1
      episode_over = terminated or truncated
      if args.schedule == "step" or (episode_over or step + 1 == args.steps):
        steps = run.progress["untrained_steps"]
        if steps:
          run.progress["untrained_steps"] = 0
          critic_loss, actor_loss = run.train(steps)
          if args.schedule == "burst" or step % 100 == 0:
            tf.summary.scalar("critic_loss", critic_loss, step=step)
            if not np.isnan(actor_loss):
              tf.summary.scalar("actor_loss", actor_loss, step=step)
      if episode_over:
        run.progress["episodes"] += 1
        last_return = episode_return
        tf.summary.scalar("episode_return", episode_return, step=step)
        obs, _ = run.env.reset(seed=args.seed + 1000 * run.progress["episodes"])
        obs, episode_return = obs.astype(np.float32), 0.0
      run.progress["env_step"] = step = step + 1
      if step % args.eval_every == 0 or step == args.steps:
        last_eval = run.evaluate()
        run.progress["eval_returns"].append([step, last_eval])
        tf.summary.scalar("eval_return", last_eval, step=step)
        now = time.time()
        tf.summary.scalar("steps_per_sec", (step - window_step) / (now - window_start), step=step)
        window_start, window_step = now, step
      if step % args.checkpoint_every == 0 or step == args.steps:
        run.save()
      bar.update(step, episode_return=last_return, eval_return=last_eval)
  bar.close()
  results = {
    "backend": args.backend,
    "seed": args.seed,
    "steps": args.steps,
    "eval_returns": run.progress["eval_returns"],
    "schedule": args.schedule,
    "sec_per_train_step": run.progress["train_seconds"] / max(run.progress["train_steps"], 1),
    "train_steps": run.progress["train_steps"],
    "train_calls": run.progress["train_calls"],
    "episodes": run.progress["episodes"],
    "resumed_from": run.progress["resumed_from"],
    "wall_seconds_this_process": time.time() - wall_start,
    "timing_this_process": run.timing,
    "hyperparameters": vars(run.hyper) | {"start_steps": args.start_steps},
    "versions": {
      "torch": torch.__version__,
      "tensorflow": tf.__version__,
      "gymnasium": gym.__version__,
    },
    "exchange_stats": tb.exchange_stats(),
    # Which runner each module's graph calls took (tb.timeline() says it).
    "runners": _runners_taken(),
    # Threads of this process at the end (Linux): TF's pools, torch's
    # OpenMP teams, the torch thread of the bridge, Python's own.
    "threads_at_end": (
      len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    ),
  }
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  # The curve shows this run and every other run beside it (other backends
  # and seeds written to sibling directories).
  results["curve"] = reporting.plot_learning_curves(
    os.path.dirname(os.path.abspath(args.out)), os.path.join(args.out, "learning_curve.png")
  )
  return results, run.agent


def main(argv=None):
  args = parse_args(argv)
  torch.set_num_threads(args.threads)
  tf.config.threading.set_intra_op_parallelism_threads(args.threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  # Every graph call of this program runs on TF's one inter-op thread, and
  # the program runs no torch code of its own between them: its torch code
  # runs there, with no hand-off to torchbridge's torch thread (README, "One
  # torch thread": the trade, measured). Set before the first graph call.
  os.environ.setdefault("TORCHBRIDGE_TORCH_THREAD", "0")
  os.makedirs(args.out, exist_ok=True)
  results, agent = train(args)
  print(reporting.summary(results, args.out))
  if args.export and args.backend == "torchbridge":
    # Serve what was trained: the actor as TF ops, in a process without torch.
    results["export"] = export.export_actor(
      agent.actor, agent.actor.torch_module.l1.in_features, args.out, args.seed
    )
    with open(os.path.join(args.out, "results.json"), "w") as f:
      json.dump({k: v for k, v in results.items() if k != "curve"}, f, indent=1)
    print(export.summary(results["export"]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
