"""One Stable-Baselines3 run, with the RL Zoo's settings, in a process of its own.

Usage:
  python -m benchmarks.sb3_process {td3,recurrent-ppo} --seed S --out DIR

`td3`: SB3's TD3 on Pendulum-v1 with the RL Zoo's hyper-parameters
(`hyperparams/td3.yml`: 20k steps, gamma 0.98, buffer 200k, the first
10k steps random, then after each episode as many gradient steps as
steps collected, lr 1e-3, Gaussian exploration noise 0.1, 400-300 nets).
`recurrent-ppo`: SB3-contrib's RecurrentPPO on CartPole-v1 with the cart
and pole velocities removed, as examples/ppo_lstm_cartpole.py sees it (the
RL Zoo's `CartPoleNoVel-v1` settings from `hyperparams/ppo_lstm.yml`).

The wall time is `learn()`'s, as SB3 users call it. The final return is
measured after it, outside the wall time, with the same protocol as the
examples' final evaluation: deterministic actions, the examples'
evaluation seeds. Writes DIR/results.json.
"""

import argparse
import json
import os
import sys
import time

import torch  # noqa: F401  (first, as everywhere here)
import gymnasium as gym
import numpy as np

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _td3(seed, steps):
  from stable_baselines3 import TD3
  from stable_baselines3.common.noise import NormalActionNoise

  env = gym.make("Pendulum-v1")
  model = TD3(
    "MlpPolicy",
    env,
    gamma=0.98,
    buffer_size=200_000,
    learning_starts=10_000,
    action_noise=NormalActionNoise(np.zeros(1), 0.1 * np.ones(1)),
    gradient_steps=-1,
    train_freq=(1, "episode"),
    learning_rate=1e-3,
    policy_kwargs=dict(net_arch=[400, 300]),
    seed=seed,
    verbose=0,
  )
  start = time.perf_counter()
  model.learn(total_timesteps=steps)
  wall = time.perf_counter() - start
  # examples/td3_pendulum.py's final evaluation: 5 episodes, its seeds.
  returns = []
  eval_env = gym.make("Pendulum-v1")
  for k in range(5):
    obs, _ = eval_env.reset(seed=10_000 + 100 * seed + k)
    done, total = False, 0.0
    while not done:
      action, _ = model.predict(obs, deterministic=True)
      obs, reward, terminated, truncated, _ = eval_env.step(action)
      total += float(reward)
      done = terminated or truncated
    returns.append(total)
  return {
    "learn_s": wall,
    "final_return": float(np.mean(returns)),
    "gradient_steps": int(model._n_updates),
  }


def _evaluate_recurrent(model, normalize, seed, episodes=10):
  """examples/ppo_lstm_cartpole.py's evaluation: greedy, its seeds."""
  sys.path.insert(0, EXAMPLES)
  from ppo import networks  # the examples' CartPole without velocities

  returns = []
  for k in range(episodes):
    env = networks.make_env()
    obs, _ = env.reset(seed=10_000 + 100 * seed + k)
    state, first, done, total = None, np.ones((1,), bool), False, 0.0
    while not done:
      action, state = model.predict(
        normalize(obs[None]), state=state, episode_start=first, deterministic=True
      )
      obs, reward, terminated, truncated, _ = env.step(int(action[0]))
      first = np.zeros((1,), bool)
      total += float(reward)
      done = terminated or truncated
    returns.append(total)
  return float(np.mean(returns))


def _recurrent_ppo(seed, steps, eval_every):
  from sb3_contrib import RecurrentPPO
  from stable_baselines3.common.callbacks import BaseCallback
  from stable_baselines3.common.env_util import make_vec_env
  from stable_baselines3.common.vec_env import VecNormalize

  sys.path.insert(0, EXAMPLES)
  from ppo import networks

  # hyperparams/ppo_lstm.yml, CartPoleNoVel-v1 (normalize: true).
  venv = VecNormalize(make_vec_env(networks.make_env, n_envs=8, seed=seed), gamma=0.98)
  model = RecurrentPPO(
    "MlpLstmPolicy",
    venv,
    n_steps=32,
    batch_size=256,
    gae_lambda=0.8,
    gamma=0.98,
    n_epochs=20,
    ent_coef=0.0,
    learning_rate=lambda left: left * 1e-3,
    clip_range=lambda left: left * 0.2,
    policy_kwargs=dict(
      ortho_init=False,
      activation_fn=torch.nn.ReLU,
      lstm_hidden_size=64,
      enable_critic_lstm=True,
      net_arch=dict(pi=[64], vf=[64]),
    ),
    seed=seed,
    verbose=0,
  )
  evals, eval_seconds = [], [0.0]

  class _Evaluations(BaseCallback):
    """Evaluates every `eval_every` steps, as the example does; its time
    is taken out of the wall time (SB3's learn() alone is timed)."""

    def _on_step(self):
      return True

    def _on_rollout_end(self):
      step = self.num_timesteps
      if step // eval_every > (step - 256) // eval_every:
        start = time.perf_counter()
        evals.append([step, _evaluate_recurrent(model, venv.normalize_obs, seed)])
        eval_seconds[0] += time.perf_counter() - start

  start = time.perf_counter()
  model.learn(total_timesteps=steps, callback=_Evaluations())
  wall = time.perf_counter() - start - eval_seconds[0]
  final = _evaluate_recurrent(model, venv.normalize_obs, seed)
  evals.append([int(model.num_timesteps), final])
  first = next((s for s, r in evals if r >= 400.0), None)
  return {
    "learn_s": wall,
    "evaluation_seconds_taken_out": eval_seconds[0],
    "final_return": final,
    "eval_returns": evals,
    "first_step_at_or_above_400": first,
  }


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("algo", choices=("td3", "recurrent-ppo"))
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--steps", type=int, default=None)
  p.add_argument("--threads", type=int, default=2)
  p.add_argument(
    "--eval-every", type=int, default=5120, help="recurrent-ppo: steps between evaluations"
  )
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  torch.set_num_threads(args.threads)
  os.makedirs(args.out, exist_ok=True)
  if args.algo == "td3":
    result = _td3(args.seed, args.steps or 20_000)
  else:
    result = _recurrent_ppo(args.seed, args.steps or 150_000, args.eval_every)
  import stable_baselines3

  result.update(
    algo=args.algo,
    seed=args.seed,
    versions={"stable_baselines3": stable_baselines3.__version__, "torch": torch.__version__},
  )
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(result, f, indent=1)
  print(json.dumps(result))


if __name__ == "__main__":
  main()
