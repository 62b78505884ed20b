"""The benchmark suite's quick mode runs end to end, so it cannot rot."""

import ast
import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch  # before TensorFlow
import numpy as np
import pytest
import tensorflow as tf

import torchbridge as tb
from torchbridge._native import _loader
from benchmarks import bare_native
from benchmarks import compiled_step
from benchmarks import harness
from benchmarks import numpy_bridge
from benchmarks import report
from benchmarks import td3_venvs
from benchmarks import td3_wall

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from td3.networks import TorchCritic  # noqa: E402

# A slow suite: `make test-long` and CI run it, `make test` and `make check` do not.
# The bridge's costs: in-process graph calls on the torch runner.
pytestmark = [pytest.mark.slow, pytest.mark.one_pass, pytest.mark.usefixtures("bridge_runner")]


def test_quick_run_writes_table_json_targets_and_plots(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
  )
  assert out.returncode == 0, out.stdout + out.stderr
  assert "targets:" in out.stdout and "training step, small_mlp" in out.stdout
  assert "headline" in out.stdout
  if tb.native_available():  # the floor is made of bare native ops
    assert "decomposition, small_mlp" in out.stdout
  results = json.loads((tmp_path / "latest.json").read_text())
  env = results["environment"]
  assert env["torch"] == torch.__version__ and env["tensorflow"] == tf.__version__
  assert env["threads"]["torch_intra"] == env["threads"]["tf_intra"]

  # Every training-step contender ran in processes of its own.
  steps = results["train_steps"]["small_mlp"]
  expected = {
    "torchbridge tf.function",
    "keras tf.function",
    "pure torch",
    "numpy-copy bridge tf.function",
  }
  if tb.native_available():
    expected |= {
      "torchbridge tf.function (tf.py_function path)",
      "floor: TF function + Keras Adam + 2 bare native ops",
    }
  assert expected <= set(steps)
  pids = [p["pid"] for t in steps.values() for p in t["processes"]]
  assert len(pids) == len(set(pids)) and os.getpid() not in pids
  for name, t in steps.items():
    assert t["processes"] and all(p["contender"] == name for p in t["processes"])
    assert t["min"] <= t["median_us"] <= t["max"]
    for p in t["processes"]:
      assert p["threads"] == {
        "torch_intra": env["threads"]["torch_intra"],
        "tf_intra": env["threads"]["tf_intra"],
      }
      assert len(p["samples_us"]) == p["repeats"] and p["median_us"] > 0

  # The headline ratios are those of the separate processes' medians.
  ratios = results["headline"]["small_mlp"]
  for other, key in (
    ("pure torch", "torchbridge / pure torch"),
    ("keras tf.function", "torchbridge / keras"),
  ):
    assert ratios[key]["ratio"] == pytest.approx(
      steps["torchbridge tf.function"]["median_us"] / steps[other]["median_us"]
    )
  if tb.native_available():
    labels = [label for label, _ in results["decomposition"]["small_mlp"]]
    assert "floor: TF function + Keras Adam + 2 bare native ops" in labels

  after = results["torch_after_bridge"]
  assert after["processes"][0]["pid"] not in pids
  assert after["processes"][0]["bridged_calls"] == 1000
  assert after["ratio_right_after"] == pytest.approx(
    after["processes"][0]["right_after_us"] / after["processes"][0]["before_us"]
  )

  names = {t["name"] for t in results["targets"]}
  assert {
    "exchange bytes copied (torchbridge, all sizes)",
    "small_mlp tf.function step: torchbridge / pure torch",
    "pure torch on the main thread right after 1,000 bridged calls / before them",
  } <= names
  if tb.native_available():
    assert (
      "bridge's own overhead per call in tf.function, native op (us over a bare native op)"
    ) in names
  for target in results["targets"]:
    assert set(target) == {"name", "measured", "limit", "met"}
    assert isinstance(target["met"], bool)
  bytes_copied = {k: v["bytes_copied"] for k, v in results["exchange"].items()}
  assert all(b["torchbridge"] == 0 for b in bytes_copied.values())
  assert bytes_copied["16MB"]["numpy_copy"] == 2 * (16 << 20)
  assert (tmp_path / "exchange.png").stat().st_size > 1000
  assert (tmp_path / "train_steps.png").stat().st_size > 1000


def test_full_run_targets_have_issue_16_names():
  # The full run's targets, from records shaped as the full run writes them
  # (TD3 and every model), without running it.
  def timing(us, key="median_us"):
    return {key: us, "min": us, "max": us, "spread": 0.0, "processes": [{key: us, "pid": 1}]}

  steps = {
    name: timing(us)
    for name, us in (
      ("torchbridge tf.function", 1100.0),
      ("pure torch", 1000.0),
      ("keras tf.function", 1200.0),
      ("numpy-copy bridge tf.function", 4000.0),
    )
  }
  results = {
    "train_steps": {m: steps for m in ("small_mlp", "cnn", "large_mlp")},
    "td3": {
      name: timing(ms, "ms_per_train_step")
      for name, ms in (("torchbridge", 10.0), ("pure torch", 9.0), ("keras", 11.0))
    },
    "torch_after_bridge": {"ratio_right_after": 1.2},
  }
  results["headline"] = report.headline(results)
  assert set(results["headline"]) == {"small_mlp", "cnn", "large_mlp", "td3"}
  targets = {t["name"]: t for t in report.targets(results)}
  assert set(targets) == {
    "TD3 train step: torchbridge / pure torch",
    "TD3 train step: torchbridge / native Keras",
    "small_mlp tf.function step: torchbridge / pure torch",
    "cnn tf.function step: torchbridge / pure torch",
    "large_mlp tf.function step: torchbridge / pure torch",
    "large_mlp tf.function step: speed-up over numpy-copy bridge",
    "pure torch on the main thread right after 1,000 bridged calls / before them",
  }
  assert targets["TD3 train step: torchbridge / pure torch"]["met"] is False
  assert targets["TD3 train step: torchbridge / native Keras"]["met"] is True
  assert targets["cnn tf.function step: torchbridge / pure torch"]["met"] is True
  assert targets["large_mlp tf.function step: speed-up over numpy-copy bridge"]["met"] is True
  assert (
    targets["pure torch on the main thread right after 1,000 bridged calls / before them"]["met"]
    is False
  )
  # No lean-bridge contender, no floors.
  assert report.floors(results) == []


def test_floors_take_the_targets_measures_on_the_lean_bridge():
  def run(ms, wall_s):
    return {"ms_per_train_step": ms, "wall_s": wall_s, "processes": []}

  results = {
    "td3": {
      "torchbridge": run(12.0, 30.0),
      "pure torch": run(10.0, 25.0),
      report.LEAN_TD3: run(11.5, 27.5),
      report.SCRIPTED_TD3: run(11.0, 26.25),
    }
  }
  floors = {f["name"]: f for f in report.floors(results)}
  assert floors["TD3 train step: leanest Python bridge / pure torch"]["measured"] == 1.15
  assert floors["TD3 script's wall time: leanest Python bridge / pure torch"]["measured"] == 1.1
  own = floors["TD3 train step: torchbridge / leanest Python bridge"]["measured"]
  assert own == pytest.approx(12.0 / 11.5)
  assert floors["TD3 train step: no-Python bridge / pure torch"]["measured"] == 1.1
  assert floors["TD3 script's wall time: no-Python bridge / pure torch"]["measured"] == 1.05
  lines = report.floors_markdown(report.floors(results))
  assert "| TD3 train step: leanest Python bridge / pure torch (<= 1.10) | 1.15 |" in lines
  assert "| TD3 train step: no-Python bridge / pure torch (<= 1.10) | 1.10 |" in lines
  results["td3"]["floor: bare native ops"] = run(8.0, 20.0)
  rows = dict(report.decomposition(results)["td3"])
  assert rows[report.SCRIPTED_TD3] == 11.0
  [own] = [v for k, v in rows.items() if k.startswith("bridged - no-Python bridge")]
  assert own == 1.0


def test_numpy_bridge_baseline_computes_the_same_gradients():
  # The baseline must be a faithful bridge, not a strawman: same outputs
  # and gradients as torchbridge for the same torch module.
  torch.manual_seed(0)
  module = torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)
  ).double()
  copied = numpy_bridge.NumpyBridgeModule(module)
  bridged = tb.TorchModule(module)
  x = tf.constant(np.random.default_rng(0).standard_normal((5, 4)))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x)
    y_copied, y_bridged = copied(x), bridged(x)
    loss_copied = tf.reduce_sum(y_copied**2)
    loss_bridged = tf.reduce_sum(y_bridged**2)
  np.testing.assert_allclose(y_copied.numpy(), y_bridged.numpy(), rtol=1e-12)
  np.testing.assert_allclose(
    tape.gradient(loss_copied, x).numpy(), tape.gradient(loss_bridged, x).numpy(), rtol=1e-12
  )
  grads_copied = tape.gradient(loss_copied, copied.trainable_variables)
  grads_bridged = dict(
    zip(
      [v.name.split("/", 1)[1].split(":")[0] for v in bridged.trainable_variables],
      tape.gradient(loss_bridged, bridged.trainable_variables),
    )
  )
  for name, g in zip([n for n, _ in module.named_parameters()], grads_copied):
    np.testing.assert_allclose(g.numpy(), grads_bridged[name].numpy(), rtol=1e-12)


@pytest.mark.usefixtures("own_crossings_only")
def test_numpy_round_trip_copies_every_byte_and_torchbridge_none():
  x = tf.random.uniform([1024])
  assert numpy_bridge.bytes_copied_by_round_trip(x) == 2 * 4096
  y = numpy_bridge.exchange_round_trip(x)
  np.testing.assert_array_equal(y.numpy(), x.numpy())
  tb.reset_exchange_stats()
  z = tb.to_tf(tb.to_torch(x))
  assert tb.exchange_stats() == {"zero_copy": 2, "copied": 0, "bytes_copied": 0}
  assert tb.to_torch(z).data_ptr() == tb.to_torch(x).data_ptr()


@pytest.mark.skipif(not tb.native_available(), reason="needs the native op")
def test_bare_native_module_has_the_torch_modules_shapes_and_gradients():
  critic_torch = TorchCritic(3, 1)
  bare = bare_native.BareNativeModule(critic_torch, "critic")
  assert [tuple(v.shape) for v in bare.trainable_variables] == [
    tuple(p.shape) for p in critic_torch.parameters()
  ]
  obs, action = tf.ones([5, 3]), tf.ones([5, 1])

  @tf.function
  def grads():
    with tf.GradientTape() as tape:
      q1, q2 = bare(obs, action)
      loss = tf.reduce_sum(q1) + tf.reduce_sum(q2)
    return (q1, q2), tape.gradient(loss, bare.trainable_variables)

  (q1, q2), grads_tf = grads()
  assert q1.shape == q2.shape == (5, 1)
  np.testing.assert_array_equal(q1.numpy(), np.zeros((5, 1), np.float32))
  for g, v in zip(grads_tf, bare.trainable_variables):
    assert g is not None and g.shape == v.shape


@pytest.mark.skipif(not tb.native_available(), reason="needs the native op")
def test_lean_bridge_trains_as_torchbridge_does():
  # The leanest Python bridge on the native op runs the torch module: its
  # outputs and gradients are torch autograd's, as torchbridge's are.
  torch.manual_seed(0)
  critic_torch = TorchCritic(3, 1)
  own = [p.detach().clone() for p in critic_torch.parameters()]
  lean = bare_native.LeanTorchModule(critic_torch, "critic")
  bridged = tb.TorchModule(copy.deepcopy(critic_torch), name="critic")
  obs_np = np.random.default_rng(0).standard_normal((5, 3), dtype=np.float32)
  obs, action = tf.constant(obs_np), tf.fill([5, 1], 0.5)

  def grads(module):
    @tf.function
    def run():
      with tf.GradientTape() as tape:
        tape.watch(action)
        q1, q2 = module(obs, action)
        loss = tf.reduce_sum(q1) + 2.0 * tf.reduce_sum(q2)
      return (q1, q2), tape.gradient(loss, [action, *module.trainable_variables])

    return run()

  (q1, q2), grads_lean = grads(lean)
  (q1_ref, q2_ref), grads_bridged = grads(bridged)
  np.testing.assert_allclose(q1.numpy(), q1_ref.numpy(), rtol=1e-6)
  np.testing.assert_allclose(q2.numpy(), q2_ref.numpy(), rtol=1e-6)
  assert len(grads_lean) == len(grads_bridged) == 1 + len(own)
  np.testing.assert_allclose(grads_lean[0].numpy(), grads_bridged[0].numpy(), rtol=1e-5)
  # The lean module's variables are in named_parameters() order.
  bridged_by_name = {
    v.name.split("/", 1)[1].split(":")[0]: g
    for v, g in zip(bridged.trainable_variables, grads_bridged[1:])
  }
  for (name, _), g in zip(critic_torch.named_parameters(), grads_lean[1:]):
    np.testing.assert_allclose(g.numpy(), bridged_by_name[name].numpy(), rtol=1e-5, atol=1e-7)
  # Inference records nothing; the module's own parameters are back.
  tf.function(lambda: lean(obs, action))()
  assert lean._lean.records == {}
  for p, p_own in zip(critic_torch.parameters(), own):
    assert torch.equal(p, p_own)


@pytest.mark.skipif(not tb.native_available(), reason="needs the native op")
def test_td3_floor_agent_trains_bare_native_modules():
  from benchmarks import td3_process

  agent = td3_process.bare_native_agent()
  assert all(
    isinstance(m, bare_native.BareNativeModule)
    for m in (agent.actor, agent.critic, agent.actor_target, agent.critic_target)
  )
  durations = []
  step = td3_process._timed(agent.train_step, durations)
  rng = np.random.default_rng(0)
  for _ in range(2):  # a critic update, then the actor update too
    critic_loss, actor_loss = step(
      *[rng.standard_normal((8, d), dtype=np.float32) for d in (3, 1, 1, 3, 1)]
    )
  assert len(durations) == 2 and not np.isnan(actor_loss)
  assert int(agent.actor_opt.iterations) == 1
  assert int(agent.critic_opt.iterations) == 2


def _module_record(module, *args, env=None, timeout=300):
  """`python -m module *args` in a process of its own: the JSON record on
  the last line of its output."""
  out = subprocess.run(
    [sys.executable, "-m", module, *[str(a) for a in args]],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2") if env is None else env,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def _td3_process(tmp_path, backend, steps, *options, env=None):
  """`benchmarks.td3_process BACKEND` over `steps` environment steps (20
  random), in a process of its own: its JSON record."""
  return _module_record(
    "benchmarks.td3_process",
    backend,
    "--steps",
    steps,
    "--start-steps",
    20,
    *options,
    "--out",
    tmp_path / "run",
    env=env,
  )


def test_td3_process_times_the_scripts_train_steps(tmp_path):
  record = _td3_process(tmp_path, "torch", 40)
  script = json.loads((tmp_path / "run" / "results.json").read_text())
  assert record["train_steps"] == script["train_steps"] == 20
  assert record["pid"] != os.getpid() and record["ms_per_train_step"] > 0
  assert record["script_ms_per_train_step"] == pytest.approx(1e3 * script["sec_per_train_step"])
  assert record["wall_s"] > 0
  # The wall time's parts add up to it; the policy ran once per
  # environment step after the random ones, and in the final evaluation.
  split = record["wall_split"]
  assert set(split) == set(td3_wall.SCRIPT_PARTS)
  assert sum(split.values()) == pytest.approx(record["script_wall_s"])
  assert all(split[part] > 0 for part in td3_wall.SCRIPT_PARTS if part != "the rest")
  assert record["policy_calls"] == 20 + 5 * 200  # 5 evaluation episodes of 200 steps
  assert record["policy_call_median_us"] > 0
  assert record["actor_class"] == "TorchActor"


def test_td3_wall_table_has_every_part_the_ratio_and_the_floor():
  def record(scale, compute=None):
    split = {part: scale * (k + 2) for k, part in enumerate(td3_wall.SCRIPT_PARTS)}
    script_wall_s = sum(split.values())  # 20 units
    compute_s = 7.0 if compute else 0.0
    return {
      # The process's: one unit of start and exit, and the floor's timing
      # of torch's compute after the script.
      "wall_s": script_wall_s + scale + compute_s,
      "script_wall_s": script_wall_s,
      "wall_split": split,
      "policy_call_median_us": 100.0 * scale,
      "ms_per_train_step": 5.0 * scale,
      "policy_calls": 1000,
      "train_steps": 200,
      "torch_compute": compute,
      "torch_compute_s": compute_s,
    }

  runs = {
    "torchbridge": [record(1.5)] * 3,
    "pure torch": [record(1.0)] * 3,
    "keras": [record(1.25)] * 3,
    td3_wall.FLOOR: [record(1.1, {"policy_call_us": 40.0, "train_step_ms": 3.0})] * 3,
    td3_wall.LEAN: [record(1.4)] * 3,
    td3_wall.SCRIPTED: [record(1.2)] * 3,
  }
  result = td3_wall.summarize(runs)
  floor = result[td3_wall.FLOOR]
  # The floor's wall time leaves out its timing of torch's compute.
  assert floor["wall_s"] == pytest.approx(23.1)
  assert floor[td3_wall.PROCESS_START] == pytest.approx(1.1)
  # Plus torch's compute for its 1,000 policy calls and 200 train steps.
  assert floor["floor_plus_torch_s"] == pytest.approx(23.1 + 0.04 + 0.6)
  assert floor["bridge_share_s"] == pytest.approx(31.5 - 23.74)
  text = td3_wall.markdown(result, rounds=3, steps=3000)
  for part in td3_wall.PARTS:
    assert f"| {part} |" in text
  assert "| **whole run** | 31.50 | 21.00 | 26.25 | 23.10 | 29.40 | 25.20 | +10.50 |" in text
  assert "torchbridge / pure torch: 1.50x; keras / pure torch: 1.25x" in text
  assert "40 us a policy call, 3.00 ms a train step" in text
  assert "23.74 s, 1.13x pure torch's run" in text
  assert "The bridge's share of the torchbridge run: 7.76 s (25%)" in text
  assert (
    "none of torchbridge's Python): 29.40 s, 1.40x pure torch's; its train steps 7.00 ms, "
    "1.40x; torchbridge 1.07x it" in text
  )
  assert (
    "its tracing included): 25.20 s, 1.20x pure torch's; its train steps 6.00 ms, 1.20x; "
    "torchbridge 1.25x it" in text
  )


@pytest.mark.skipif(not _loader.available(), reason="needs the native op")
def test_td3_process_floor_script_runs_bare_modules_and_times_torch(tmp_path):
  record = _td3_process(tmp_path, "floor-script", 30)
  assert record["backend"] == "floor-script" and record["train_steps"] == 10
  assert sum(record["wall_split"].values()) == pytest.approx(record["script_wall_s"])
  compute = record["torch_compute"]
  assert compute["policy_call_us"] > 0 and compute["train_step_ms"] > 0
  # The timing of torch's compute came after the script, in its process.
  assert record["torch_compute_s"] > 0
  assert record["actor_class"] == "BareNativeModule"


@pytest.mark.skipif(not _loader.available(), reason="needs the native op")
def test_td3_process_lean_script_runs_the_lean_bridge(tmp_path):
  record = _td3_process(tmp_path, "lean-script", 30)
  assert record["actor_class"] == "LeanTorchModule" and record["train_steps"] == 10
  assert record["torch_compute"] is None
  script = json.loads((tmp_path / "run" / "results.json").read_text())
  # The script ran to its evaluation on the lean bridge's actor.
  [(step, episode_return)] = script["eval_returns"]
  assert step == 30 and np.isfinite(episode_return)


@pytest.mark.skipif(not _loader.has_torch_interop(), reason="needs the complete native op")
def test_td3_process_scripted_script_runs_the_no_python_bridge(tmp_path):
  record = _td3_process(tmp_path, "scripted-script", 30)
  assert record["actor_class"] == "ScriptedTorchModule" and record["train_steps"] == 10
  assert record["cpp_callbacks"] > 0
  script = json.loads((tmp_path / "run" / "results.json").read_text())
  [(step, episode_return)] = script["eval_returns"]
  assert step == 30 and np.isfinite(episode_return)


@pytest.mark.skipif(not _loader.available(), reason="needs the native op")
@pytest.mark.parametrize("choice,placement", [("script", "0"), ("on", "1")])
def test_td3_process_runs_graph_calls_where_asked(tmp_path, choice, placement):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("TORCHBRIDGE_TORCH_THREAD", None)
  record = _td3_process(tmp_path, "torchbridge", 30, "--torch-thread", choice, env=env)
  # The example runs its graph calls on TF's one inter-op thread.
  assert record["torch_thread"] == placement
  assert record["train_steps"] == 10 and record["wall_s"] > 0


@pytest.mark.parametrize("policy,traces", [("function", 1), ("eager", 0)])
def test_td3_process_calls_the_policy_as_asked(tmp_path, policy, traces):
  record = _td3_process(tmp_path, "torchbridge", 30, "--policy", policy)
  # Through the agent's tf.function `act` (traced once), or eagerly.
  assert record["policy"] == policy and record["act_traces"] == traces
  assert record["policy_calls"] == 10 + 5 * 200 and record["train_steps"] == 10


def test_td3_process_refuses_an_eager_policy_without_a_tf_function(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "benchmarks.td3_process", "torch", "--policy", "eager"]
    + ["--out", str(tmp_path)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 2
  assert "--policy eager: the torch backend has no tf.function policy" in out.stderr
  assert "use --policy function, or a TF backend (torchbridge, tf," in out.stderr


@pytest.mark.skipif(not _loader.available(), reason="needs the native op")
def test_callback_cost_times_the_bridges_python_per_call():
  result = _module_record("benchmarks.callback_cost", "--calls", 200)
  # Timings are figures, not pass/fail: each is measured and positive (an
  # ordering such as "inference < training forward" flips on a busy machine).
  keys = ["inference_us", "training_forward_us", "loop_bare_op_us", "loop_bridged_us"]
  keys += [f"{k}_after_eviction_us" for k in ("inference", "training_forward", "hand_back")]
  for key in keys:
    assert math.isfinite(result[key]) and result[key] > 0, (key, result[key])


@pytest.mark.parametrize("which", ["td3_wall", "td3_venvs"])
def test_each_run_of_the_script_gets_a_fresh_run_directory(monkeypatch, which):
  # In a directory used before, the script resumes from the last run's
  # final checkpoint and trains no step (make bench's second round failed).
  outs = []

  def run(backend, out, steps, threads, **options):
    outs.append(out)
    record = {"ms_per_train_step": 5.0, "wall_s": 20.0, "policy_call_median_us": 500.0}
    record |= {"script_wall_s": 19.0, "torch": torch.__version__, "torchbridge_file": ""}
    record |= {"native_op_complete": True, "policy_calls": 10, "train_steps": 10}
    record["wall_split"] = {part: 1.0 for part in td3_wall.SCRIPT_PARTS}
    record["torch_compute"] = {"policy_call_us": 40.0, "train_step_ms": 3.0}
    return record

  monkeypatch.setattr(td3_wall, "run_script_process", run)
  if which == "td3_wall":
    td3_wall.measure(rounds=2, steps=30, threads=1, log=lambda m: None)
    backends = len(td3_wall.BACKENDS)
  else:
    td3_venvs.measure([sys.executable], rounds=2, steps=30, threads=1, log=lambda m: None)
    backends = len(td3_venvs.BACKENDS)
  assert len(outs) == 2 * backends and len(set(outs)) == len(outs), outs


def test_td3_venvs_table_has_each_venvs_ratios():
  def backend(ms, wall_s, torch_version="2.15.0+cu132"):
    return {
      "ms_per_train_step": ms,
      "wall_s": wall_s,
      "policy_call_median_us": 500.0,
      "torch": torch_version,
      "native_op_complete": True,
    }

  result = {
    "/dev/venv/bin/python": {
      "torchbridge": backend(6.0, 18.0, "2.13.0+cpu"),
      "pure torch": backend(5.0, 15.0, "2.13.0+cpu"),
      "lean bridge": backend(5.5, 17.0, "2.13.0+cpu"),
    },
    "/user/venv/bin/python": {
      "torchbridge": backend(6.6, 20.0),
      "pure torch": backend(6.0, 16.0),
      "lean bridge": backend(6.5, 19.0),
      'run="torch"': backend(6.3, 17.6),
    },
  }
  text = td3_venvs.markdown(result, rounds=3, steps=3000)
  # run="torch" was measured in one venv only: no row for it.
  assert 'run="torch"' not in text
  result["/dev/venv/bin/python"]['run="torch"'] = backend(5.25, 16.5, "2.13.0+cpu")
  text = td3_venvs.markdown(result, rounds=3, steps=3000)
  assert '| train step, ms: torchbridge, run="torch" | 5.25 | 6.30 |' in text
  assert (
    '| train step: torchbridge, run="torch" / pure torch (target 1.10) | 1.05x | 1.05x |' in text
  )
  assert '| whole run: torchbridge, run="torch" / pure torch (target 1.2) | 1.10x | 1.10x |' in text
  assert "| | torch 2.13.0+cpu (complete op) | torch 2.15.0+cu132 (complete op) |" in text
  assert "| train step: torchbridge / pure torch (target 1.10) | 1.20x | 1.10x |" in text
  assert "| train step: torchbridge / leanest Python bridge | 1.09x | 1.02x |" in text
  assert "| whole run: torchbridge / pure torch (target 1.2) | 1.20x | 1.25x |" in text


@pytest.mark.skipif(not _loader.has_torch_interop(), reason="needs the complete native op")
def test_td3_venvs_runs_each_backend_on_the_venvs_own_packages(tmp_path, monkeypatch):
  monkeypatch.delenv("TORCHBRIDGE_TORCH_RUNNER", raising=False)  # run="torch": from C++
  # This venv's Python, as `make bench-user` passes it: -P, only
  # benchmarks/ and examples/ on the path, torchbridge from the venv.
  result = td3_venvs.measure([sys.executable], rounds=1, steps=30, threads=1, log=lambda m: None)
  [runs] = result.values()
  assert set(runs) == set(td3_venvs.BACKENDS)
  for run in runs.values():
    [record] = run["processes"]
    assert record["train_steps"] == 20 and record["torch"] == torch.__version__
    assert record["torchbridge_file"] == tb.__file__
  assert runs["lean bridge"]["processes"][0]["actor_class"] == "LeanTorchModule"
  # run="torch"'s graph calls ran from C++ (the C++ torch runner).
  assert runs['run="torch"']["processes"][0]["cpp_callbacks"] > 0
  assert runs["torchbridge"]["processes"][0]["cpp_callbacks"] == 0


def _compiled_step_process(contender):
  """`benchmarks.compiled_step --process CONTENDER`, two timed steps."""
  return _module_record(
    "benchmarks.compiled_step",
    "--process",
    contender,
    *("--calls", 2, "--repeats", 1, "--threads", 1),
    timeout=600,
  )


@pytest.mark.skipif(not _loader.available(), reason="needs the native op")
def test_compiled_step_runs_inductors_code_inside_the_bridged_calls():
  bridged = _compiled_step_process("torchbridge, compiled")
  pure = _compiled_step_process("pure torch, compiled")
  eager = _compiled_step_process("torchbridge")
  for record in (bridged, pure):
    # Two steps, one with the actor's update: the target actor and critic
    # and the critic (3 calls), plus the actor and the critic (5); each
    # call a compiled region.
    assert record["compiled_regions_per_step"] == 4
    assert record["graphs_compiled"] > 0 and record["graphs_compiled_while_timed"] == 0
    assert record["ms_per_step"] > 0 and record["first_step_s"] > 0
  # Pure torch runs them on the timing thread; the bridged step on TF's.
  assert pure["compiled_regions_per_step_on_this_thread"] == 4
  assert bridged["compiled_regions_per_step_on_this_thread"] == 0
  assert eager["compiled_regions_per_step"] == 0 and eager["graphs_compiled"] == 0
  assert bridged["native_op_complete"] and bridged["pid"] != os.getpid()
  assert bridged["torch_thread"] == "0"  # graph calls on TF's thread, as the script


def test_no_benchmark_module_sets_a_torchbridge_variable_when_imported():
  # compiled_step once set TORCHBRIDGE_TORCH_THREAD at import: every later
  # subprocess of the test run (which imports it) ran on TF's thread.
  setters = []
  for path in sorted(Path(ROOT, "benchmarks").glob("*.py")):
    for node in ast.parse(path.read_text()).body:  # the module's own statements
      text = ast.get_source_segment(path.read_text(), node) or ""
      if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        continue  # a docstring may name a variable
      if isinstance(node, (ast.Expr, ast.Assign)) and "TORCHBRIDGE_" in text:
        setters.append(f"{path.name}: {text}")
  assert not setters, setters


def test_compiled_step_table_has_each_ratio():
  def contender(ms, first_s=1.0, regions=4.0):
    process = {"ms_per_step": ms, "first_step_s": first_s, "compiled_regions_per_step": regions}
    summary = {"ms_per_step": ms, "min": ms - 0.1, "max": ms + 0.1, "first_step_s": first_s}
    return summary | {"processes": [process] * 3}

  result = {
    "pure torch": contender(4.0, 0.1, 0.0),
    "pure torch, compiled": contender(5.0, 12.0),
    "torchbridge": contender(5.2, 0.9, 0.0),
    "torchbridge, compiled": contender(6.5, 5.0),
  }
  ratios = compiled_step.ratios(result)
  assert ratios["torchbridge, compiled / pure torch"] == pytest.approx(1.625)
  assert ratios["torchbridge, compiled / pure torch, compiled"] == pytest.approx(1.3)
  assert ratios["torchbridge, compiled / torchbridge"] == pytest.approx(1.25)
  text = compiled_step.markdown(result, rounds=3)
  assert "| pure torch, compiled | 5.00 [4.90-5.10] | 1.25x | 12.00 | 4 |" in text
  assert "| torchbridge | 5.20 [5.10-5.30] | 1.30x | 0.90 | 0 |" in text
  assert "- torchbridge, compiled / pure torch, compiled: 1.30x" in text


def test_the_committed_runners_table_is_written_from_the_committed_json():
  from benchmarks import runners  # pylint: disable=import-outside-toplevel

  results = Path(ROOT) / "benchmarks" / "results"
  data = json.loads((results / "runners.json").read_text())
  text = runners.markdown(data)
  assert text.rstrip() == (results / "runners.md").read_text().rstrip()
  # TD3's ratios against both torch baselines: as written, and the actor's
  # loss differentiated for the actor only (what TF's tape asks for).
  assert "| / pure torch | / pure torch, actor loss for the actor only |" in text
  assert text.startswith(f"Measured at {data['source']['commit'][:10]}")


def test_runners_xla_contenders_run_and_the_table_shows_them(monkeypatch):
  # Torch inside XLA: the TD3 and small-MLP steps with run="torch" compiled
  # by XLA, and per call the bridged call under XLA against a bare op and
  # TF ops under XLA. A quick run of each (one timed call), in this process,
  # added to the committed JSON: the table shows each row against the
  # baseline of the same XLA setting.
  from benchmarks import harness  # pylint: disable=import-outside-toplevel
  from benchmarks import runners  # pylint: disable=import-outside-toplevel
  from torchbridge._native import _xla  # pylint: disable=import-outside-toplevel

  if not _xla.available():
    pytest.skip(f"the XLA custom call is unavailable: {_xla.unavailable()}")
  assert runners.RUN_TORCH_XLA in runners.CONTENDERS["td3"]
  assert runners.RUN_TORCH_XLA in runners.CONTENDERS["small_mlp"]
  assert {runners.RUN_TORCH_XLA, runners.BARE_CPP_XLA, runners.TF_OPS_XLA} <= set(
    runners.CONTENDERS["call"]
  )
  # As users run them: the C++ torch runner (it knows the output shapes
  # the TD3 agents declare with an unknown batch; XLA needs them static).
  monkeypatch.delenv("TORCHBRIDGE_TORCH_RUNNER")
  monkeypatch.setattr(harness, "configure_threads", lambda n: None)
  monkeypatch.setattr(harness, "calls_for", lambda step, seconds: 1)
  data = json.loads((Path(ROOT) / "benchmarks" / "results" / "runners.json").read_text())
  models_ = next(iter(data["venvs"].values()))
  new = [
    ("td3", runners.RUN_TORCH_XLA),
    ("small_mlp", runners.RUN_TORCH_XLA),
    ("call", runners.RUN_TORCH_XLA),
    ("call", runners.BARE_CPP_XLA),
    ("call", runners.TF_OPS_XLA),
  ]
  calls = _xla.calls()
  for model, contender in new:
    record = runners.one(model, contender, 1)
    assert record["median_us"] > 0 and record["contender"] == contender
    models_[model][contender] = record
  # The torch-run contenders crossed into torch through XLA's custom call.
  assert _xla.calls() > calls
  text = runners.markdown(data)
  for model, contender in new:
    assert f"| {contender} | " in text, (model, contender)
  call = models_["call"]
  over = call[runners.RUN_TORCH_XLA]["median_us"] - call[runners.BARE_CPP_XLA]["median_us"]
  assert (
    f"| {runners.RUN_TORCH_XLA} | {call[runners.RUN_TORCH_XLA]['median_us']:.1f} | {over:+.1f} |"
    in text
  )
  assert "over the bare op (same XLA), us |" in text
  mlp = models_["small_mlp"]
  ratio = mlp[runners.RUN_TORCH_XLA]["median_us"] / mlp[runners.KERAS_XLA]["median_us"]
  assert f"| {runners.RUN_TORCH_XLA} | " in text and f" | {ratio:.2f}x | " in text


def _run_on_the_cpp_runner(module, *args):
  """`python -m module *args`, its graph calls on the C++ torch runner as
  users get it (not bridge_runner's Python path); the finished process."""
  out = subprocess.run(
    [sys.executable, "-m", module, *args],
    cwd=ROOT,
    env={k: v for k, v in os.environ.items() if k != "TORCHBRIDGE_TORCH_RUNNER"},
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.mark.skipif(not _loader.has_torch_interop(), reason="needs the complete native op")
def test_guard_cost_splits_the_runners_per_call_cost(tmp_path):
  from benchmarks import guard_cost  # pylint: disable=import-outside-toplevel

  _run_on_the_cpp_runner(
    "benchmarks.guard_cost", "--repeats", "2", "--calls", "5", "--out", str(tmp_path)
  )
  result = json.loads((tmp_path / "guard_cost.json").read_text())
  native = (
    guard_cost.RUNNER,
    guard_cost.NO_CHECK,
    guard_cost.TORCH_CPP_BOXED,
    guard_cost.TORCH_CPP,
    guard_cost.BARE,
  )
  names = native + (
    guard_cost.CAPTURE,
    guard_cost.CAPTURE_SPEC,
    guard_cost.PLAIN,
    guard_cost.TORCH,
    guard_cost.GUARD,
    guard_cost.PRE_CAPTURE,
    guard_cost.PRE_PLAIN,
  )
  for name in names:
    timing = result["timings"][name]
    assert len(timing["samples_us"]) == 2 and timing["median_us"] > 0, name
  # The callback's span, timed for each contender with a native op (and
  # for no other: the capture rows and torch's loop have no native op).
  spans = result["callback_median_us"]
  assert sorted(spans) == sorted(native) and all(v > 0 for v in spans.values())
  text = (tmp_path / "guard_cost.md").read_text()
  assert text == guard_cost.markdown(result)
  assert "of it the stale-state check" in text and "the runner's own C++" in text
  assert "torch's own work in the call" in text and "(tb.timeline's span)" in text
  assert "the check's own Python" in text and "TF's Python before the executor" in text


@pytest.mark.skipif(not _loader.has_torch_interop(), reason="needs the complete native op")
def test_busy_floor_puts_the_runners_callback_time_back_into_its_floor(tmp_path):
  from benchmarks import busy_floor  # pylint: disable=import-outside-toplevel

  out = _run_on_the_cpp_runner("benchmarks.busy_floor", "--one", "--rounds", "1", "--steps", "4")
  record = json.loads(out.stdout.strip().splitlines()[-1])
  c = record["contenders"]
  assert sorted(c) == sorted(busy_floor.NAMES)
  for name in (busy_floor.PYTHON_PATH, busy_floor.TORCH, busy_floor.TORCH_COMPUTE):
    assert c[name]["step_ms"] > 0 and "rows_ms" not in c[name], name
  for name in busy_floor.RECORDED:
    assert c[name]["step_ms"] > 0 and c[name]["rows_ms"][busy_floor.TF_SIDE] > 0, name
  # The runner's calls ran on the C++ runner (their callbacks recorded),
  # and the floors' callbacks worked the time they were given: each step
  # runs at least the critic's four calls, each at least `busy_ns`.
  assert record["runner_callbacks_per_step"] >= 4 and record["callbacks_per_step"] >= 4
  at_least_ms = 4 * min(record["busy_ns"]) / 1e6
  assert at_least_ms > 0
  for name in (busy_floor.SPIN, busy_floor.MEMORY, busy_floor.MATMULS):
    assert c[name]["rows_ms"][busy_floor.CALLBACKS] >= at_least_ms, name
  assert c[busy_floor.FLOOR]["rows_ms"][busy_floor.CALLBACKS] < at_least_ms

  # Processes combine figure by figure, each the median over them.
  slower = json.loads(json.dumps(record))
  for name in busy_floor.NAMES:
    slower["contenders"][name]["step_ms"] *= 3
  combined = busy_floor.combine([record, slower, slower])
  step = combined["contenders"][busy_floor.RUNNER]["step_ms"]
  assert step == pytest.approx(3 * c[busy_floor.RUNNER]["step_ms"])
  assert combined["busy_ns"] == record["busy_ns"] + 2 * slower["busy_ns"]
  data = {
    "source": record["environment"]["source"],
    "processes": 3,
    "rounds": 1,
    "steps_per_block": 4,
    "threads": 2,
    "venvs": {sys.executable: combined},
  }
  text = busy_floor.markdown(data)
  assert f"| {busy_floor.RUNNER} | {step:.2f} | " in text
  assert "TF's side over the floor's: the runner's" in text


def test_write_results_writes_the_json_and_the_table(tmp_path, capsys):
  data = {"median_us": 1.5, "rows": [1, 2]}
  harness.write_results(tmp_path / "new", "bench", data, "| a | 1.5 |\n")
  assert json.loads((tmp_path / "new" / "bench.json").read_text()) == data
  assert (tmp_path / "new" / "bench.json").read_text().endswith("\n")
  assert (tmp_path / "new" / "bench.md").read_text() == "| a | 1.5 |\n"
  assert "| a | 1.5 |" in capsys.readouterr().out


def test_the_committed_demo_wall_and_paired_step_tables_are_written_from_their_json():
  from benchmarks import demo_wall  # pylint: disable=import-outside-toplevel
  from benchmarks import paired_step  # pylint: disable=import-outside-toplevel

  results = Path(ROOT) / "benchmarks" / "results"
  for module, stem in ((demo_wall, "demo_wall"), (paired_step, "paired_step")):
    data = json.loads((results / f"{stem}.json").read_text())
    text = module.markdown(data)
    assert text.rstrip() == (results / f"{stem}.md").read_text().rstrip(), stem
    assert text.startswith(f"Measured at {data['source']['commit'][:10]}"), stem


def _demo_record(seed, wall_s, script_s, train_s, final_return):
  return {
    "seed": seed,
    "wall_s": wall_s,
    "script_s": script_s,
    "train_s": train_s,
    "ms_per_train_step": 1e3 * train_s / 100,
    "final_return": final_return,
    "foreign_load_cores": 0.0,
  }


def test_demo_wall_table_has_each_seed_the_ratios_and_the_split():
  from benchmarks import demo_wall  # pylint: disable=import-outside-toplevel

  runs = {
    "torchbridge": [
      _demo_record(0, 110.0, 104.0, 90.0, -96.0),
      _demo_record(1, 130.0, 124.0, 100.0, -93.0),
    ],
    "pure torch": [
      _demo_record(0, 100.0, 95.0, 92.0, -97.0),
      _demo_record(1, 120.0, 115.0, 101.0, -94.0),
    ],
    "Keras port": [
      _demo_record(0, 88.0, 83.0, 70.0, -95.0),
      _demo_record(1, 99.0, 94.0, 80.0, -93.5),
    ],
  }
  source = {"commit": "0123456789abcdef", "changed_since": []}
  text = demo_wall.markdown({"backends": runs, "steps": 20000, "rounds": 2, "source": source})
  assert "| 0 | 110.0 | 100.0 | 88.0 | 1.10x | 1.25x |" in text
  assert "| 1 | 130.0 | 120.0 | 99.0 | 1.08x | 1.31x |" in text
  assert "| median | 120.0 | 110.0 | 93.5 | 1.09x | 1.28x |" in text
  # The parts: imports = wall - script; rest = script - train steps.
  assert "| imports, Python's start and exit, s | 6.0 | 5.0 | 5.0 |" in text
  assert "| train steps, s | 95.0 | 96.5 | 75.0 |" in text
  assert "| the rest of the script, s | 19.0 | 8.5 | 13.5 |" in text
  assert (
    "| final evaluation return (each seed) | -96.0 / -93.0 | -97.0 / -94.0 | -95.0 / -93.5 |"
    in text
  )
  assert "policy" not in text  # runs that did not time the policy's calls

  # Runs that timed them: the policy's calls come out of the rest.
  for label, policy_s in (("torchbridge", 8.0), ("pure torch", 2.0), ("Keras port", 7.0)):
    for record in runs[label]:
      record.update(
        policy_s=policy_s,
        policy_calls=1001,
        first_policy_call_s=policy_s / 4,
        first_train_step_s=1.5,
      )
  text = demo_wall.markdown({"backends": runs, "steps": 20000, "rounds": 2, "source": source})
  assert "| the policy's calls, s | 8.0 | 2.0 | 7.0 |" in text
  assert "| the rest of the script, s | 11.0 | 6.5 | 6.5 |" in text
  # (8.0 - 2.0) s over the 1,000 calls after the first.
  assert (
    "| the policy's call, us (1,001 calls, the mean after the first) | 6000 | 1500 | 5250 |" in text
  )
  assert "| the first train step, s (the same) | 1.50 | 1.50 | 1.50 |" in text


def test_demo_wall_runs_make_demos_command_in_one_process(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "benchmarks.demo_wall", "--one", "torchbridge", "1", "10200"]
    + [str(tmp_path / "run")],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads(out.stdout.strip().splitlines()[-1])
  script = json.loads((tmp_path / "run" / "results.json").read_text())
  assert record["argv"][-1] == "--jit-compile" and "--export" not in record["argv"]
  assert script["seed"] == 1 and script["steps"] == 10200
  # After 10,000 random steps, one episode's burst: 200 train steps, one call.
  assert record["train_steps"] == script["train_steps"] == 200
  assert script["train_calls"] == 1
  assert record["final_return"] == script["eval_returns"][-1][1]
  assert record["train_s"] == pytest.approx(script["sec_per_train_step"] * 200)
  assert 0 < record["train_s"] < record["script_s"]
  # The policy's calls, timed by the script: 200 exploring (after the
  # 10,000 random steps) and six evaluations' 5 episodes of 200.
  assert record["policy_calls"] == 200 + 6 * 5 * 200
  assert 0 < record["first_policy_call_s"] < record["policy_s"]
  assert record["policy_s"] + record["train_s"] < record["script_s"]
  assert 0 < record["first_train_step_s"] <= record["train_s"]  # one burst
  # make demo's graph calls take the TF runner (each module's translation).
  assert {r["runner"] for r in record["runners"].values()} == {"tf"}


def test_paired_step_ratios_are_per_round_then_per_process_medians():
  from benchmarks import paired_step  # pylint: disable=import-outside-toplevel

  def blocks(scale):
    return {
      name: [scale[name] * (1.0 + 0.1 * r) for r in range(3)] for name in paired_step.CONTENDERS
    }

  base = {name: 1000.0 for name in paired_step.CONTENDERS}
  first = dict(base, **{paired_step.TB_XLA: 1200.0, paired_step.TORCH: 1500.0})
  second = dict(base, **{paired_step.TB_XLA: 1100.0, paired_step.TORCH: 1250.0})
  result = paired_step.summarize([{"blocks_us": blocks(first)}, {"blocks_us": blocks(second)}])
  row = result[paired_step.TB_XLA]
  assert row["ratio_to_per_process"][paired_step.KERAS_XLA] == pytest.approx([1.2, 1.1])
  assert row["ratio_to"][paired_step.KERAS_XLA] == pytest.approx(1.15)
  assert row["ratio_to"][paired_step.TORCH] == pytest.approx(np.median([1200 / 1500, 1100 / 1250]))
  assert row["median_us_per_process"] == pytest.approx([1320.0, 1210.0])


def test_weight_layout_table_is_written_from_its_json_and_times_both_layouts():
  from benchmarks import weight_layout  # pylint: disable=import-outside-toplevel

  results = Path(ROOT) / "benchmarks" / "results"
  data = json.loads((results / "weight_layout.json").read_text())
  assert (
    weight_layout.markdown(data).rstrip() == (results / "weight_layout.md").read_text().rstrip()
  )
  record = weight_layout.one(rounds=2)
  for name in weight_layout.FORMS:
    assert len(record["blocks_us"][name]) == 2 and min(record["blocks_us"][name]) > 0
  for form in (weight_layout.TORCH_LAYOUT, weight_layout.TORCH_LAYOUT_XLA_FORM):
    ratios = weight_layout.summarize([record, record])["ratio_to_keras"][form]["per_process"]
    assert ratios[0] == ratios[1] > 0
  blocks = record["blocks_us"]
  halved = {name: [v / 2 for v in blocks[name]] for name in weight_layout.FORMS}
  halved[weight_layout.KERAS_LAYOUT] = blocks[weight_layout.KERAS_LAYOUT]
  summary = weight_layout.summarize([{"blocks_us": halved}])["ratio_to_keras"]
  want = np.median(
    np.array(halved[weight_layout.TORCH_LAYOUT]) / blocks[weight_layout.KERAS_LAYOUT]
  )
  assert summary[weight_layout.TORCH_LAYOUT]["ratio"] == pytest.approx(want)


def test_weight_layouts_compute_the_same_step():
  from benchmarks import weight_layout  # pylint: disable=import-outside-toplevel

  # The same weights, stored either way, in either form: the same losses,
  # step after step.
  steps = [weight_layout._step(form) for form in weight_layout.FORMS]  # pylint: disable=protected-access
  for _ in range(3):
    losses = [float(step()) for step in steps]
    np.testing.assert_allclose(losses[:2], [losses[2]] * 2, rtol=1e-5)


@pytest.mark.slow
def test_rl_jobs_runs_every_contender_against_sb3_and_tables_what_they_measured(tmp_path):
  # A smoke run (--tiny: a few hundred steps each) of benchmarks/rl_jobs.py:
  # every contender is a process of its own, SB3's included, and the table
  # holds each one's own figures.
  pytest.importorskip("sb3_contrib")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks.rl_jobs",
      "both",
      "--tiny",
      "--seeds",
      "0",
      "--out",
      str(tmp_path),
      "--runs",
      str(tmp_path / "runs"),
    ],
    cwd=harness.ROOT,
    capture_output=True,
    text=True,
    timeout=1500,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  data = json.loads((tmp_path / "rl_jobs.json").read_text())
  table = (tmp_path / "rl_jobs.md").read_text()
  for job in ("td3", "ppo"):  # the learning curves, drawn from what it wrote
    assert (tmp_path / f"rl_jobs_{job}.png").stat().st_size > 1000
  assert set(data["jobs"]["td3"]) == {"torchbridge", "pure torch", "Keras port", "SB3 TD3"}
  assert set(data["jobs"]["ppo"]) == {"torchbridge", "pure torch", "SB3-contrib RecurrentPPO"}
  runs = data["runs"]["td3"]["0"]
  assert runs["torchbridge"]["gradient_steps"] == 200  # steps 400..599, in bursts
  assert runs["torchbridge"]["train_calls"] < runs["torchbridge"]["gradient_steps"]
  assert runs["torchbridge"]["runners"]["critic"]["runner"] == "tf"
  assert runs["SB3 TD3"]["gradient_steps"] == 0  # the RL Zoo starts learning at 10k
  ours = data["jobs"]["td3"]["torchbridge"]
  assert ours["policy_call_vs_pure_torch"] == pytest.approx(
    runs["torchbridge"]["policy_call_us"] / runs["pure torch"]["policy_call_us"]
  )
  for job, rows in data["jobs"].items():
    for name, row in rows.items():
      assert row["loop_s_mean"] > 0 and np.isfinite(row["final_return_mean"]), (job, name)
      assert f"| {name} | {row['loop_s_mean']:.1f} s |" in table
  assert data["environment"]["source"]["commit"][:12] in table
