"""TD3 on Pendulum with Ray rollout workers: actors act, the driver learns.

N Ray actors (`RolloutWorker`, a `tb.ray.TorchModuleWorker`) each hold the
torch actor network as a `tb.TorchModule` and their own gymnasium
`Pendulum-v1`, and collect transitions with exploration noise. The learner
on the driver is the torchbridge TD3 agent of `td3_pendulum.py` (torch
actor and twin-Q critic, Keras Adam, `tf.function` train step); it trains
one step per collected transition and every `--push-every` environment
steps sends the actor's weights to all workers with one `ray.put`.

Acting and learning overlap: while the workers collect the next round, the
driver trains on the last one, so a round is acted with the weights of the
push before (one round of policy lag, as in Ape-X style learners).

  python examples/td3_ray.py --out runs/td3_ray                  # local Ray
  python examples/td3_ray.py --address auto --out runs/td3_ray   # a cluster
  python examples/td3_ray.py --steps 400 --start-steps 200 --out /tmp/t  # quick

Writes DIR/results.json. On a cluster every node needs torchbridge, torch,
TensorFlow and gymnasium; the `td3` package next to this script travels with
the job (pickled by value).
"""

import argparse
import functools
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TF's C++ logs

import torch  # noqa: E402  (first, the recommended order: docs/troubleshooting.md, "Does the import order matter?")
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchbridge as tb  # noqa: E402
import td3  # noqa: E402
from td3 import agents  # noqa: E402
from td3 import networks  # noqa: E402
from td3 import replay  # noqa: E402

# The workers need the td3 package too: pickling it by value ships it with
# the actor class, so a cluster's nodes need no copy of this directory.
ray.cloudpickle.register_pickle_by_value(td3)

ENV_ID = "Pendulum-v1"


@ray.remote(num_cpus=1)
class RolloutWorker(tb.ray.TorchModuleWorker):
  """Acts in its own environment with the latest actor weights it was sent."""

  def __init__(self, obs_dim, act_dim, max_action, seed, expl_noise):
    super().__init__(
      functools.partial(networks.TorchActor, obs_dim, act_dim, max_action), name="actor"
    )
    self.max_action, self.expl_noise = max_action, expl_noise
    self.env = gym.make(ENV_ID)
    self.rng = np.random.default_rng(seed)
    self.seed, self.episodes, self.episode_return = seed, 0, 0.0
    self.obs, _ = self.env.reset(seed=seed)
    self.act = tf.function(lambda obs: self.module(obs[None])[0])

  def rollout(self, num_steps, random_actions):
    """`num_steps` transitions, and the returns of the episodes they ended."""
    obs_dim = self.obs.shape[0]
    out = {
      "obs": np.zeros((num_steps, obs_dim), np.float32),
      "action": np.zeros((num_steps, 1), np.float32),
      "reward": np.zeros((num_steps,), np.float32),
      "next_obs": np.zeros((num_steps, obs_dim), np.float32),
      "terminated": np.zeros((num_steps,), bool),
      "episode_returns": [],
    }
    for i in range(num_steps):
      obs = self.obs.astype(np.float32)
      if random_actions:
        action = self.rng.uniform(-self.max_action, self.max_action, size=1)
      else:
        noise = self.rng.normal(0, self.max_action * self.expl_noise, size=1)
        action = np.clip(
          self.act(tf.constant(obs)).numpy() + noise, -self.max_action, self.max_action
        )
      next_obs, reward, terminated, truncated, _ = self.env.step(action.astype(np.float32))
      out["obs"][i], out["action"][i], out["reward"][i] = obs, action, reward
      out["next_obs"][i], out["terminated"][i] = next_obs, terminated
      self.episode_return += float(reward)
      self.obs = next_obs
      if terminated or truncated:
        out["episode_returns"].append(self.episode_return)
        self.episodes += 1
        self.episode_return = 0.0
        self.obs, _ = self.env.reset(seed=self.seed + 1000 * self.episodes)
    return out


def evaluate(agent, episodes, seed):
  """Mean return of the learner's deterministic policy, on the driver."""
  env = gym.make(ENV_ID)
  returns = []
  for k in range(episodes):
    obs, _ = env.reset(seed=10_000 + 100 * seed + k)
    done, total = False, 0.0
    while not done:
      obs, reward, terminated, truncated, _ = env.step(agent.policy(obs.astype(np.float32)))
      total += reward
      done = terminated or truncated
    returns.append(total)
  return float(np.mean(returns))


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument(
    "--address",
    default=None,
    help="Ray cluster address ('auto', 'ray://host:10001'); default: start Ray on this machine",
  )
  p.add_argument("--workers", type=int, default=2, help="rollout workers")
  p.add_argument("--steps", type=int, default=20000, help="environment steps, all workers together")
  p.add_argument(
    "--push-every",
    type=int,
    default=200,
    help="environment steps between weight pushes (one round: "
    "each worker collects push-every / workers steps)",
  )
  p.add_argument(
    "--start-steps",
    type=int,
    default=1000,
    help="steps of uniform random actions before the policy acts",
  )
  p.add_argument("--eval-every", type=int, default=2000)
  p.add_argument("--eval-episodes", type=int, default=5)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
    "--threads", type=int, default=1, help="threads for the learner's kernels (torch and TF)"
  )
  p.add_argument("--out", required=True, help="run directory")
  return p.parse_args(argv)


def train(args):
  env = gym.make(ENV_ID)
  obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
  max_action = float(env.action_space.high[0])
  hyper = agents.Hyper()
  agent = agents.TFAgent("torchbridge", obs_dim, act_dim, max_action, args.seed, hyper)
  buffer = replay.ReplayBuffer(obs_dim, act_dim, capacity=max(args.steps, 1))
  rng = np.random.default_rng(args.seed)
  start = time.perf_counter()
  workers = [
    RolloutWorker.remote(obs_dim, act_dim, max_action, args.seed + 1 + i, hyper.expl_noise)
    for i in range(args.workers)
  ]
  # One ray.put for all workers; calls made later to a worker run after it.
  ray.get(tb.ray.broadcast_weights(agent.actor, workers))
  ready = time.perf_counter()
  print(f"{args.workers} rollout workers ready in {ready - start:.1f} s", flush=True)
  per_worker = max(args.push_every // args.workers, 1)
  progress = {
    "env_steps": 0,
    "train_steps": 0,
    "pushes": 1,
    "push_seconds": 0.0,
    "train_seconds": 0.0,
    "episode_returns": [],
    "eval_returns": [],
  }

  def launch():
    random_actions = progress["env_steps"] < args.start_steps
    return [w.rollout.remote(per_worker, random_actions) for w in workers]

  rollouts = launch()
  next_eval = args.eval_every
  while progress["env_steps"] < args.steps:
    collected = 0
    for out in ray.get(rollouts):
      for i in range(len(out["reward"])):
        buffer.add(
          out["obs"][i],
          out["action"][i],
          out["reward"][i],
          out["next_obs"][i],
          out["terminated"][i],
        )
      collected += len(out["reward"])
      progress["episode_returns"].extend(out["episode_returns"])
    progress["env_steps"] += collected
    if progress["env_steps"] < args.steps:
      rollouts = launch()  # the workers act while the driver learns
    # One update per transition collected after the first start_steps, as
    # in td3_pendulum.py.
    updates = min(collected, progress["env_steps"] - args.start_steps)
    if updates > 0:
      t = time.perf_counter()
      for _ in range(updates):
        agent.train_step(*buffer.sample(rng, hyper.batch_size))
      progress["train_seconds"] += time.perf_counter() - t
      progress["train_steps"] += updates
      t = time.perf_counter()
      tb.ray.broadcast_weights(agent.actor, workers)  # runs before the next round
      progress["push_seconds"] += time.perf_counter() - t
      progress["pushes"] += 1
    if progress["env_steps"] >= next_eval or progress["env_steps"] >= args.steps:
      progress["eval_returns"].append(
        [progress["env_steps"], evaluate(agent, args.eval_episodes, args.seed)]
      )
      next_eval += args.eval_every
      recent = progress["episode_returns"][-10:]
      print(
        f"env steps {progress['env_steps']:6d}  eval return "
        f"{progress['eval_returns'][-1][1]:8.1f}  last 10 episodes "
        f"{np.mean(recent) if recent else float('nan'):8.1f}  pushes "
        f"{progress['pushes']}",
        flush=True,
      )
  # Every worker ends with the learner's final actor weights.
  final_np = agent.actor.get_weights()
  workers_agree = all(
    all(np.array_equal(w_np[k], v) for k, v in final_np.items())
    for w_np in ray.get([w.get_weights.remote() for w in workers])
  )
  wall = time.perf_counter() - ready
  for w in workers:
    ray.kill(w)
  return {
    "workers": args.workers,
    "steps": progress["env_steps"],
    "push_every": args.push_every,
    "seed": args.seed,
    "eval_returns": progress["eval_returns"],
    "episodes": len(progress["episode_returns"]),
    "train_steps": progress["train_steps"],
    "pushes": progress["pushes"],
    "sec_per_push": progress["push_seconds"] / max(progress["pushes"] - 1, 1),
    "sec_per_train_step": progress["train_seconds"] / max(progress["train_steps"], 1),
    "env_steps_per_sec": progress["env_steps"] / wall,
    "wall_seconds": wall,
    "workers_hold_learner_weights": workers_agree,
    "hyperparameters": vars(hyper) | {"start_steps": args.start_steps},
  }


def main(argv=None):
  args = parse_args(argv)
  torch.set_num_threads(args.threads)
  tf.config.threading.set_intra_op_parallelism_threads(args.threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  if not ray.is_initialized():
    # Locally, no dashboard (it costs a laptop CPU); a cluster keeps its own.
    ray.init(address=args.address, **({} if args.address else {"include_dashboard": False}))
  os.makedirs(args.out, exist_ok=True)
  results = train(args)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  print(
    f"{results['steps']} env steps by {results['workers']} workers, "
    f"{results['train_steps']} train steps, {results['pushes']} weight "
    f"pushes ({1e3 * results['sec_per_push']:.2f} ms each to send); "
    f"{results['env_steps_per_sec']:.0f} env steps/s; final eval return "
    f"{results['eval_returns'][-1][1]:.1f}; workers hold the learner's "
    f"weights: {results['workers_hold_learner_weights']}"
  )
  print(f"wrote {os.path.join(args.out, 'results.json')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
