"""Idle OpenMP teams are released: the user's when a bridged call is traced,
the torch thread's after 5 ms without work (both paths).

Each case runs in a fresh process (an OpenMP team is per thread, and the
test process has made its own): the user's thread makes a team (a parallel
torch op on 2 threads adds its worker thread to the process), tracing a
bridged `tf.function` releases it (the worker thread exits), and
`TORCHBRIDGE_RELEASE_USER_TEAM=0` keeps it. Results stay right, and the
team comes back when the user's thread runs parallel torch code again. An
eager call made while graph calls are in use releases the team it made.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge

CHILD = textwrap.dedent("""
    import json, os, time
    import torch
    import tensorflow as tf
    import torchbridge as tb
    from torchbridge._runtime import _omp_team

    def threads():
      return len(os.listdir("/proc/self/task"))

    v = tf.ones([4, 3])                 # TF's context and pools are up
    torch.set_num_threads(2)
    x = torch.randn(512, 512)
    net = tb.TorchModule(torch.nn.Linear(3, 1), name="net", run="torch")
    f = tf.function(lambda v: net(v))
    before = threads()
    (x @ x).sum()                       # the user's thread makes its team
    with_team = threads()
    f.get_concrete_function(v)          # traced: the team is released
    time.sleep(0.5)                     # the released worker exits
    after_trace = threads()
    y = f(v)
    expected = net.torch_module(torch.ones(4, 3)).detach().numpy()
    (x @ x).sum()                       # and comes back when needed
    again = threads()
    print(json.dumps({"before": before, "with_team": with_team,
                      "after_trace": after_trace, "again": again,
                      "releases": _omp_team.releases,
                      "equal": bool((y.numpy() == expected).all())}))
    """)


def run_child(env_update):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="2")
  env.update(env_update)
  out = subprocess.run(
    [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_tracing_a_graph_call_releases_the_users_idle_team():
  result = run_child({})
  if result["with_team"] == result["before"]:
    pytest.skip("torch made no OpenMP worker here (no OpenMP build?)")
  assert result["releases"] >= 1
  assert result["after_trace"] < result["with_team"], result
  assert result["again"] > result["after_trace"], result
  assert result["equal"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_the_release_can_be_turned_off():
  result = run_child({"TORCHBRIDGE_RELEASE_USER_TEAM": "0"})
  assert result["releases"] == 0
  assert result["after_trace"] >= result["with_team"], result
  assert result["equal"]


IDLE_CHILD = textwrap.dedent("""
    import ctypes, json, os, time
    import torch
    import tensorflow as tf
    import torchbridge as tb
    from torchbridge._native import _loader
    from torchbridge._runtime import _omp_team

    def threads():
      return len(os.listdir("/proc/self/task"))

    def teams_released():  # by the torch thread of the path in use
      if _loader.load() is None:
        return _omp_team.releases
      lib = ctypes.CDLL(str(_loader.loaded_from()))
      lib.torchbridge_teams_released.restype = ctypes.c_int64
      return lib.torchbridge_teams_released()

    torch.set_num_threads(2)
    v = tf.random.normal([512, 512])
    net = tb.TorchModule(torch.nn.Linear(512, 512), name="net", run="torch")
    f = tf.function(lambda v: net(v))
    f(v)
    time.sleep(0.05)
    released_before = teams_released()
    # A count just after a call can miss the team where the machine paused
    # this thread for more than the 5 ms idle time in between (the team was
    # released again, as it should be): the most seen after any call counts.
    busy = 0                            # the torch thread and its team
    for _ in range(20):
      y = f(v)
      busy = max(busy, threads())
    time.sleep(0.05)                    # idle 5 ms: its team released
    idle = threads()
    released = teams_released() - released_before
    again = 0                           # the next call makes a new team
    for _ in range(5):
      y = f(v)
      again = max(again, threads())
    expected = net.torch_module(torch.from_numpy(v.numpy()))
    print(json.dumps({"busy": busy, "idle": idle, "again": again,
                      "released": released,
                      "equal": bool(torch.equal(torch.from_numpy(y.numpy()),
                                                expected.detach()))}))
    """)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
@pytest.mark.parametrize("path", ["native", "py_function"])
@pytest.mark.parametrize("release", [True, False])
def test_the_torch_threads_team_is_released_when_idle(path, release):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="2", **_path_env(path))
  if not release:
    env["TORCHBRIDGE_RELEASE_USER_TEAM"] = "0"
  out = subprocess.run(
    [sys.executable, "-c", IDLE_CHILD], env=env, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["equal"]
  if release:
    # The worker left with the team; the torch thread (0.2 s) did not.
    assert result["released"] >= 1, result
    assert result["idle"] == result["busy"] - 1, result
    assert result["again"] == result["busy"], result
  else:
    assert result["released"] == 0, result
    assert result["idle"] == result["busy"], result


MIXED_CHILD = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import tensorflow as tf
    import torchbridge as tb
    from torchbridge._runtime import _omp_team, _placement

    # However slow this machine, the eager calls below count as made while
    # graph calls are in use (test_eager_call_done covers the window).
    _placement.GRAPH_CALLS_IN_USE_S = 600.0

    def threads():
      return len(os.listdir("/proc/self/task"))

    def release():                      # even with the bridge's release off
      pause = _omp_team._find_pause()
      if pause:
        pause(1)                        # omp_pause_soft

    def settled():                      # released workers and idle threads exit
      time.sleep(0.4)
      return threads()

    torch.set_num_threads(2)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 1))
    mlp = tb.TorchModule(net, name="mlp", run="torch")
    one, batch = tf.ones([1, 3]), tf.ones([256, 3])
    train = tf.function(lambda x: tf.reduce_sum(mlp(x)))
    if sys.argv[1] == "graph":
      train(batch)                      # graph calls in use
    release()
    before = settled()                  # the user's thread has no team
    (torch.ones(256, 256) @ torch.ones(256, 256)).sum()
    makes_worker = settled() > before   # torch's OpenMP makes a worker here
    release()
    before = settled()
    mlp(batch)                          # eager, as a policy acts on a batch
                                        # (a [1, 3] forward is too small for
                                        # torch to open a parallel region)
    after_call = settled()
    release()
    settled()
    with tf.GradientTape() as tape:     # an eager forward and backward
      loss = tf.reduce_sum(mlp(batch))
    grads = tape.gradient(loss, mlp.trainable_variables)
    after_backward = settled()
    with torch.no_grad():
      (torch.ones(256, 256) @ torch.ones(256, 256)).sum()  # torch's own code
    own_code = settled()
    expected = net(torch.ones(1, 3)).detach().numpy()
    print(json.dumps({"makes_worker": makes_worker, "before": before,
                      "after_call": after_call, "after_backward": after_backward,
                      "own_code": own_code,
                      "equal": bool((mlp(one).numpy() == expected).all()),
                      "grads": len([g for g in grads if g is not None])}))
    """)


def run_mixed(mode, env_update):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="2", **env_update)
  out = subprocess.run(
    [sys.executable, "-c", MIXED_CHILD, mode],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  if not result["makes_worker"]:
    pytest.skip("torch made no OpenMP worker here (no OpenMP build?)")
  assert result["equal"] and result["grads"] == 6
  return result


def _path_env(path):
  from torchbridge._native import _loader  # pylint: disable=import-outside-toplevel

  if path == "native" and _loader.load() is None:
    pytest.skip("needs the native op")
  return {"TORCHBRIDGE_DISABLE_NATIVE": "1" if path == "py_function" else "0"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
@pytest.mark.parametrize("path", ["native", "py_function"])
def test_eager_calls_release_their_team_while_graph_calls_are_in_use(path):
  # The TD3 example calling its policy eagerly and training in a
  # tf.function ran each train step at half speed beside the team its
  # eager calls made. Each eager call (forward, backward) now leaves no
  # worker behind; the user's own torch code makes the team again.
  result = run_mixed("graph", _path_env(path))
  assert result["after_call"] == result["after_backward"] == result["before"], result
  assert result["own_code"] == result["before"] + 1, result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
@pytest.mark.parametrize(
  "mode,env", [("eager", {}), ("graph", {"TORCHBRIDGE_RELEASE_USER_TEAM": "0"})]
)
def test_eager_calls_keep_their_team_without_graph_calls_or_when_turned_off(mode, env):
  result = run_mixed(mode, env)
  assert result["after_call"] == result["after_backward"] == result["before"] + 1, result


def test_eager_call_done_releases_only_while_graph_calls_are_in_use(monkeypatch):
  from torchbridge._runtime import _omp_team  # pylint: disable=import-outside-toplevel
  from torchbridge._runtime import _placement  # pylint: disable=import-outside-toplevel

  released = []
  monkeypatch.setattr(_omp_team, "release_user_team", lambda: released.append(1))
  monkeypatch.setattr(_placement, "_last_graph_call", float("-inf"))
  _placement.eager_call_done()
  assert not released  # no graph call yet
  now = time.monotonic()
  monkeypatch.setattr(_placement, "_last_graph_call", now - 0.5)
  _placement.eager_call_done()
  assert len(released) == 1  # one started within the window
  monkeypatch.setattr(_placement, "_last_graph_call", now - 2 * _placement.GRAPH_CALLS_IN_USE_S)
  _placement.eager_call_done()
  assert len(released) == 1  # the window has passed

  def on_a_graph_thread():  # an eager call nested in a graph call's torch code
    _placement.graph_call_ran()
    _placement.eager_call_done()

  worker = threading.Thread(target=on_a_graph_thread)
  worker.start()
  worker.join()
  assert len(released) == 1  # that thread's team is the graph calls'
  _placement.eager_call_done()  # on this thread, after that graph call: released
  assert len(released) == 2
