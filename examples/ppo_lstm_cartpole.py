"""Recurrent PPO on CartPole without velocities: a torch LSTM in a TF loop.

A torch LSTM actor-critic (`ppo/networks.py`) wrapped in `tb.TorchModule`,
trained by Keras Adam in a `tf.function` PPO update over zero-padded
minibatches of sequences with the loss masked by `tf.sequence_mask`, on
gymnasium's CartPole-v1 with the cart and pole velocities removed from the
observation (a policy must remember to infer them). Checkpointed by
`tf.train.CheckpointManager`, logged to TensorBoard. `--backend torch` runs
the same algorithm in pure PyTorch from the same initial weights;
`--policy mlp` swaps in a memoryless network; `--loss unmasked` averages
the loss over the padding too (the bug RLlib's PPO once had).

  python examples/ppo_lstm_cartpole.py --steps 100000 --seed 0 \
      --out runs/ppo/lstm_masked_torchbridge_s0

A killed run started again with the same --out resumes from its last
checkpoint (network, optimizer, counters, random stream; the environments
start new episodes). Writes DIR/results.json, DIR/learning_curve.png (every
run found beside DIR), DIR/checkpoints/ and DIR/tensorboard/.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TF's C++ logs

import torch  # noqa: E402  (first, the recommended order)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchbridge as tb  # noqa: E402
from ppo import agents  # noqa: E402
from ppo import networks  # noqa: E402
from ppo import normalize  # noqa: E402
from ppo import reporting  # noqa: E402
from ppo import sequences  # noqa: E402


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--backend", choices=("torchbridge", "torch"), default="torchbridge")
  p.add_argument("--policy", choices=tuple(networks.POLICIES), default="lstm")
  p.add_argument("--loss", choices=("masked", "unmasked"), default="masked")
  p.add_argument("--steps", type=int, default=100_000, help="environment steps")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True, help="run directory")
  p.add_argument(
    "--eval-every", type=int, default=5120, help="environment steps between evaluations"
  )
  p.add_argument("--eval-episodes", type=int, default=10)
  p.add_argument("--checkpoint-every", type=int, default=10240)
  p.add_argument(
    "--n-steps", type=int, default=agents.Hyper.n_steps, help="steps per environment and rollout"
  )
  p.add_argument(
    "--max-seq-len",
    type=int,
    default=agents.Hyper.max_seq_len,
    help="the padded length T of the training sequences",
  )
  p.add_argument(
    "--schedule",
    choices=("burst", "step"),
    default="burst",
    help="burst (default): a rollout's PPO epochs in one graph call (a tf.while_loop) "
    "when a rollout is one minibatch; step: a graph call per epoch",
  )
  p.add_argument(
    "--reward-scale",
    choices=("on", "off"),
    default="on",
    help="on (default, the RL Zoo's `normalize`): rewards divided by the running "
    "standard deviation of the discounted return, as SB3's VecNormalize does",
  )
  p.add_argument("--threads", type=int, default=1, help="threads for each framework's kernels")
  return p.parse_args(argv)


def sample(rng, logits):
  """Categorical samples and their log-probabilities, from a numpy stream."""
  logp_all = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  cdf = np.cumsum(np.exp(logp_all), -1)
  actions = (rng.random(len(logits))[:, None] > cdf[:, :-1]).sum(-1)
  return actions, logp_all[np.arange(len(logits)), actions]


def reset_state_where(state, done):
  """The state with the rows of finished episodes set to zeros."""
  keep = (~done).astype(np.float32)[None, :, None]
  return tuple(tuple(s * keep for s in pair) for pair in state)


class Run:
  """One training run: environments, agent, counters, checkpoints."""

  def __init__(self, args):
    self.args = args
    self.hyper = agents.Hyper(n_steps=args.n_steps, max_seq_len=args.max_seq_len)
    self.envs = [networks.make_env() for _ in range(self.hyper.n_envs)]
    obs_dim = self.envs[0].observation_space.shape[0]
    self.n_actions = int(self.envs[0].action_space.n)
    self.agent = agents.make_agent(
      args.backend,
      args.policy,
      obs_dim,
      self.n_actions,
      args.seed,
      self.hyper,
      masked=args.loss == "masked",
    )
    if args.backend != "torch":
      self.tf_checkpoint = tf.train.CheckpointManager(
        self.agent.checkpoint(), os.path.join(args.out, "checkpoints"), max_to_keep=2
      )
    self.rollout = sequences.Rollout(self.hyper.n_steps, self.hyper.n_envs, obs_dim)
    self.reward_scale = (
      normalize.RewardScale(self.hyper.n_envs, self.hyper.gamma)
      if args.reward_scale == "on"
      else None
    )
    self.rng = np.random.default_rng(args.seed)
    self.progress = {
      "env_step": 0,
      "iteration": 0,
      "episodes": 0,
      "eval_returns": [],
      "updates": 0,
      "update_seconds": 0.0,
      "rollout_seconds": 0.0,
      "resumed_from": None,
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
    state = dict(self.progress, rng=self.rng.bit_generator.state)
    if self.reward_scale is not None:
      state["reward_scale"] = self.reward_scale.state()
    tmp = self._progress_path() + ".tmp"
    with open(tmp, "w") as f:
      json.dump(state, f)
    os.replace(tmp, self._progress_path())  # the checkpoint counts from here

  def restore(self):
    """Continues from the last complete checkpoint, if there is one."""
    if not os.path.exists(self._progress_path()):
      return False
    with open(self._progress_path()) as f:
      state = json.load(f)
    step = state["env_step"]
    ckpt_dir = os.path.join(self.args.out, "checkpoints")
    if self.args.backend == "torch":
      self.agent.load_state_dict(torch.load(os.path.join(ckpt_dir, f"torch-{step}.pt")))
    else:
      self.tf_checkpoint.checkpoint.restore(
        os.path.join(ckpt_dir, f"ckpt-{step}")
      ).assert_consumed()
    self.rng.bit_generator.state = state.pop("rng")
    scale = state.pop("reward_scale", None)
    if scale is not None and self.reward_scale is not None:
      self.reward_scale.load(scale)
    self.progress = dict(state, resumed_from=step)
    return True

  # --- acting ----------------------------------------------------------
  def collect(self, obs, state, starts, episode_returns):
    """Fills the rollout; returns where it ended and the finished returns."""
    rollout, finished = self.rollout, []
    if obs is None:  # a fresh start (or a resumed run): new episodes
      base = self.args.seed * 1_000_003 + 1000 * self.progress["episodes"]
      obs = np.stack([env.reset(seed=base + i)[0] for i, env in enumerate(self.envs)])
      state, starts = networks.zero_state(self.hyper.n_envs), np.ones(self.hyper.n_envs, bool)
    for t in range(self.hyper.n_steps):
      rollout.obs[t], rollout.starts[t] = obs, starts
      rollout.store_state(t, state)
      logits, values, state = self.agent.act(obs, state)
      actions, logp = sample(self.rng, logits)
      rollout.actions[t], rollout.logp[t], rollout.values[t] = actions, logp, values
      done, truncated_obs = np.zeros(self.hyper.n_envs, bool), {}
      obs = obs.copy()
      for i, env in enumerate(self.envs):
        next_obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
        rollout.rewards[t, i] = reward
        episode_returns[i] += reward
        if terminated or truncated:
          done[i] = True
          finished.append(episode_returns[i])
          episode_returns[i] = 0.0
          self.progress["episodes"] += 1
          if truncated and not terminated:
            truncated_obs[i] = next_obs
          next_obs, _ = env.reset()
        obs[i] = next_obs
      if self.reward_scale is not None:
        rollout.rewards[t] = self.reward_scale(rollout.rewards[t], done)
      if truncated_obs:
        # Cut by the time limit, not ended: the return goes on past the
        # cut, so its value is bootstrapped (SB3's and RLlib's handling).
        final_obs = obs.copy()
        for i, last in truncated_obs.items():
          final_obs[i] = last
        _, final_values, _ = self.agent.act(final_obs, state)
        for i in truncated_obs:
          rollout.rewards[t, i] += self.hyper.gamma * final_values[i]
      rollout.dones[t] = done
      state, starts = reset_state_where(state, done), done
    _, last_values, _ = self.agent.act(obs, state)
    return obs, state, starts, last_values, finished

  def evaluate(self):
    """Mean return of greedy episodes, run side by side."""
    n = self.args.eval_episodes
    envs = [networks.make_env() for _ in range(n)]
    obs = np.stack(
      [env.reset(seed=10_000 + 100 * self.args.seed + k)[0] for k, env in enumerate(envs)]
    )
    state, returns = networks.zero_state(n), np.zeros(n)
    alive = np.ones(n, bool)
    while alive.any():
      logits, _, state = self.agent.act(obs, state)
      for k in np.flatnonzero(alive):
        next_obs, reward, terminated, truncated, _ = envs[k].step(int(logits[k].argmax()))
        returns[k] += reward
        obs[k] = next_obs
        alive[k] = not (terminated or truncated)
    return float(returns.mean())

  # --- learning --------------------------------------------------------
  def learn(self, last_values):
    hyper, args = self.hyper, self.args
    progress_left = 1.0 - self.progress["env_step"] / args.steps
    lr, clip_range = hyper.lr * progress_left, hyper.clip_range * progress_left
    advantages, returns = self.rollout.advantages(last_values, hyper.gamma, hyper.gae_lambda)
    pieces = self.rollout.sequences(hyper.max_seq_len)
    # The share of the padded batch that is padding (what the mask removes).
    self.progress.setdefault("padded_fractions", []).append(
      1.0 - pieces[:, 2].sum() / (len(pieces) * hyper.max_seq_len)
    )
    stats = None
    if hyper.minibatches == 1 and args.schedule == "burst":
      # One minibatch: every epoch trains on the same batch, in one call.
      batch = self.rollout.padded(pieces, advantages, returns, hyper.max_seq_len)
      start = time.perf_counter()
      stats = self.agent.update_epochs(batch, clip_range, lr, hyper.epochs)
      self.progress["update_seconds"] += time.perf_counter() - start
      self.progress["updates"] += hyper.epochs
      return stats, len(pieces)
    for _ in range(hyper.epochs):
      order = self.rng.permutation(len(pieces))
      for part in np.array_split(order, hyper.minibatches):
        batch = self.rollout.padded(pieces[part], advantages, returns, hyper.max_seq_len)
        start = time.perf_counter()
        stats = self.agent.update(batch, clip_range, lr)
        self.progress["update_seconds"] += time.perf_counter() - start
        self.progress["updates"] += 1
    return stats, len(pieces)


def train(args):
  tb.reset_exchange_stats()
  run = Run(args)
  resumed = run.restore()
  writer = tf.summary.create_file_writer(os.path.join(args.out, "tensorboard"))
  bar = reporting.ProgressBar(args.steps, start=run.progress["env_step"])
  if resumed:
    print(f"resuming from checkpoint at step {run.progress['env_step']}", flush=True)
  steps_per_rollout = run.hyper.n_steps * run.hyper.n_envs
  obs = state = starts = None
  episode_returns, recent, last_eval = np.zeros(run.hyper.n_envs), [], None
  wall_start = time.time()
  with writer.as_default():
    while run.progress["env_step"] < args.steps:
      start = time.perf_counter()
      obs, state, starts, last_values, finished = run.collect(obs, state, starts, episode_returns)
      run.progress["rollout_seconds"] += time.perf_counter() - start
      stats, n_sequences = run.learn(last_values)
      run.progress["env_step"] += steps_per_rollout
      run.progress["iteration"] += 1
      step = run.progress["env_step"]
      recent = (recent + finished)[-20:]
      for ret in finished:
        tf.summary.scalar("episode_return", ret, step=step)
      for name, value in stats.items():
        tf.summary.scalar(f"update/{name}", value, step=step)
      tf.summary.scalar("update/sequences_per_rollout", n_sequences, step=step)
      if step % args.eval_every < steps_per_rollout or step >= args.steps:
        last_eval = run.evaluate()
        run.progress["eval_returns"].append([step, last_eval])
        tf.summary.scalar("eval_return", last_eval, step=step)
      if step % args.checkpoint_every < steps_per_rollout or step >= args.steps:
        run.save()
      bar.update(
        min(step, args.steps),
        episode_return=float(np.mean(recent)) if recent else None,
        eval_return=last_eval,
      )
  bar.close()
  results = reporting.results(run, args, time.time() - wall_start)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  results["curve"] = reporting.plot_learning_curves(
    os.path.dirname(os.path.abspath(args.out)), os.path.join(args.out, "learning_curve.png")
  )
  return results


def main(argv=None):
  args = parse_args(argv)
  torch.set_num_threads(args.threads)
  tf.config.threading.set_intra_op_parallelism_threads(args.threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  os.makedirs(args.out, exist_ok=True)
  results = train(args)
  print(reporting.summary(results, args.out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
