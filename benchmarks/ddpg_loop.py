"""A DDPG-shaped loop against its Keras twin, each in processes of its own.

Usage:
  python -m benchmarks.ddpg_loop [--rounds 3] [--steps 1500] [--out DIR]
  python -m benchmarks.ddpg_loop --one BACKEND [--steps N]   (one process)

The loop has the shape of keras.io's DDPG on Pendulum, the TF RL code a
team drops a torch model into: each environment step calls the policy
eagerly on one state and reads the action as numpy, steps a Pendulum
(its dynamics in numpy, as gymnasium's `Pendulum-v1` writes them), stores
the transition, runs one update in a `tf.function` (critic and actor
losses under `tf.GradientTape`, Keras Adam) on a batch of 64, and moves
both target networks by `get_weights` / `set_weights`. Actor 3-256-256-1
(tanh, times 2), critic 4-256-256-1 on the state and action concatenated.

Backends: "keras" (Keras `Sequential` models), "torchbridge" (the same
networks in torch, each a `tb.keras.TorchLayer`: graph calls on its TF
translation, eager calls in torch), "torchbridge run='torch'" (graph
calls in torch through the C++ torch runner). Every process times the
same `--steps` after 100 steps that fill the buffer and warm up; it
reports the loop's wall time and the time in each part. Writes
`results/ddpg_loop.json` (with the commit) and `results/ddpg_loop.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import torchbridge as tb  # noqa: E402
from benchmarks import harness  # noqa: E402

KERAS, BRIDGE, BRIDGE_TORCH = "keras", "torchbridge", "torchbridge run='torch'"
BACKENDS = (KERAS, BRIDGE, BRIDGE_TORCH)
WARMUP_STEPS, BATCH, GAMMA, TAU = 100, 64, 0.99, 0.005
PARTS = ("policy", "environment", "update", "targets")


class Pendulum:
  """gymnasium's Pendulum-v1 dynamics, in numpy (no episode limit)."""

  def __init__(self, seed):
    self.rng = np.random.default_rng(seed)
    self.theta, self.omega = self.rng.uniform([-np.pi, -1.0], [np.pi, 1.0])

  def observe(self):
    return np.array([np.cos(self.theta), np.sin(self.theta), self.omega], np.float32)

  def step(self, torque):
    u = float(np.clip(torque, -2.0, 2.0))
    angle = (self.theta + np.pi) % (2 * np.pi) - np.pi
    reward = -(angle**2 + 0.1 * self.omega**2 + 0.001 * u**2)
    self.omega = np.clip(self.omega + (3 * 10.0 / 2 * np.sin(self.theta) + 3.0 * u) * 0.05, -8, 8)
    self.theta = self.theta + self.omega * 0.05
    return self.observe(), np.float32(reward)


def _torch_mlp(n_in, last_tanh):
  layers = [
    torch.nn.Linear(n_in, 256),
    torch.nn.ReLU(),
    torch.nn.Linear(256, 256),
    torch.nn.ReLU(),
    torch.nn.Linear(256, 1),
  ]
  if last_tanh:
    layers.append(torch.nn.Tanh())
  return torch.nn.Sequential(*layers)


def _keras_mlp(n_in, last_tanh):
  return keras.Sequential(
    [
      keras.Input((n_in,)),
      keras.layers.Dense(256, activation="relu"),
      keras.layers.Dense(256, activation="relu"),
      keras.layers.Dense(1, activation="tanh" if last_tanh else None),
    ]
  )


def networks(backend):
  """(actor, critic, target actor, target critic) of `backend`, built."""
  torch.manual_seed(0)
  keras.utils.set_random_seed(0)
  made = []
  for n_in, last_tanh in ((3, True), (4, False), (3, True), (4, False)):
    if backend == KERAS:
      made.append(_keras_mlp(n_in, last_tanh))
    else:
      run = "torch" if backend == BRIDGE_TORCH else "auto"
      layer = tb.keras.TorchLayer(_torch_mlp(n_in, last_tanh), run=run)
      layer(tf.zeros([1, n_in]))  # built
      made.append(layer)
  made[2].set_weights(made[0].get_weights())
  made[3].set_weights(made[1].get_weights())
  return made


def loop(backend, steps, seed=0):
  """Runs the loop; returns its wall time and the time in each part (s)."""
  actor, critic, target_actor, target_critic = networks(backend)
  actor_opt, critic_opt = keras.optimizers.Adam(1e-3), keras.optimizers.Adam(2e-3)

  @tf.function
  def update(s, a, r, s2):
    with tf.GradientTape() as tape:
      a2 = 2.0 * target_actor(s2)
      y = r + GAMMA * target_critic(tf.concat([s2, a2], -1))
      critic_loss = tf.reduce_mean((y - critic(tf.concat([s, a], -1))) ** 2)
    grads = tape.gradient(critic_loss, critic.trainable_variables)
    critic_opt.apply_gradients(zip(grads, critic.trainable_variables))
    with tf.GradientTape() as tape:
      actor_loss = -tf.reduce_mean(critic(tf.concat([s, 2.0 * actor(s)], -1)))
    grads = tape.gradient(actor_loss, actor.trainable_variables)
    actor_opt.apply_gradients(zip(grads, actor.trainable_variables))
    return critic_loss

  def move_target(target, source):
    weights = [w * TAU + t * (1 - TAU) for w, t in zip(source.get_weights(), target.get_weights())]
    target.set_weights(weights)

  env, rng = Pendulum(seed), np.random.default_rng(seed)
  total = WARMUP_STEPS + steps
  buffer = {
    "s": np.zeros((total, 3), np.float32),
    "a": np.zeros((total, 1), np.float32),
    "r": np.zeros((total, 1), np.float32),
    "s2": np.zeros((total, 3), np.float32),
  }
  state = env.observe()
  parts = dict.fromkeys(PARTS, 0.0)
  start = None
  for i in range(total):
    if i == WARMUP_STEPS:
      parts = dict.fromkeys(PARTS, 0.0)
      start = time.perf_counter()
    t0 = time.perf_counter()
    action = 2.0 * np.squeeze(actor(tf.constant(state[None])).numpy())
    action = np.clip(action + 0.2 * rng.standard_normal(), -2.0, 2.0)
    t1 = time.perf_counter()
    next_state, reward = env.step(action)
    for key, value in (("s", state), ("a", action), ("r", reward), ("s2", next_state)):
      buffer[key][i] = value
    state = next_state
    t2 = time.perf_counter()
    index = rng.integers(0, i + 1, BATCH)
    loss = update(*(tf.constant(buffer[k][index]) for k in ("s", "a", "r", "s2")))
    t3 = time.perf_counter()
    move_target(target_actor, actor)
    move_target(target_critic, critic)
    t4 = time.perf_counter()
    for part, spent in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
      parts[part] += spent
  wall = time.perf_counter() - start
  return {"loop_s": wall, "parts_s": parts, "last_loss": float(loss)}


def one(backend, steps):
  harness.configure_threads(os.cpu_count() or 1)
  record = loop(backend, steps)
  record.update(pid=os.getpid(), backend=backend, steps=steps)
  return record


def measure(rounds, steps, log=print):
  jobs = {
    backend: (
      lambda backend=backend: harness.run_process(
        "benchmarks.ddpg_loop", ["--one", backend, "--steps", steps]
      )
    )
    for backend in BACKENDS
  }
  runs = harness.alternated(jobs, rounds=rounds, log=lambda m: log(f"  ddpg_loop {m}"))
  return {
    "environment": harness.environment(os.cpu_count() or 1, "cpu"),
    "rounds": rounds,
    "steps": steps,
    "results": {b: harness.over_processes(runs[b], key="loop_s") for b in BACKENDS},
    "failures": harness.FAILURES,
  }


def markdown(data):
  env = data["environment"]
  commit = (env["source"]["commit"] or "?")[:7]
  keras_loop = data["results"][KERAS]["loop_s"]
  lines = [
    f"DDPG-shaped loop, {data['steps']} environment steps (each: an eager policy call, "
    "a graph update on a batch of 64, two target updates by `set_weights`), at "
    f"{commit}: torch {env['torch']}, TF {env['tensorflow']}, {env['cpu_count']} cores; "
    f"the median over {data['rounds']} processes per backend, alternated; ms per "
    "environment step.",
    "",
    "| backend | whole step | vs Keras | policy call | environment | update | target updates |",
    "|---|---|---|---|---|---|---|",
  ]
  for backend in BACKENDS:
    result = data["results"][backend]
    per_step = 1e3 / data["steps"]
    median_process = sorted(result["processes"], key=lambda r: r["loop_s"])[
      len(result["processes"]) // 2
    ]
    parts = " | ".join(f"{median_process['parts_s'][p] * per_step:.2f}" for p in PARTS)
    lines.append(
      f"| {backend} | {result['loop_s'] * per_step:.2f} | "
      f"{result['loop_s'] / keras_loop:.2f}x | {parts} |"
    )
  lines += [
    "",
    "(whole step: the timed loop over its steps; parts: the process of median loop time)",
  ]
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.ddpg_loop", description=__doc__)
  parser.add_argument("--one", choices=BACKENDS)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=1500)
  parser.add_argument("--out", default=os.path.join(harness.ROOT, "benchmarks", "results"))
  args = parser.parse_args(argv)
  if args.one:
    print(json.dumps(one(args.one, args.steps)))
    return
  data = measure(args.rounds, args.steps)
  harness.write_results(args.out, "ddpg_loop", data, markdown(data))


if __name__ == "__main__":
  main()
