"""The user's idle OpenMP team is released when a bridged call is traced.

Each case runs in a fresh process (an OpenMP team is per thread, and the
test process has made its own): the user's thread makes a team (a parallel
torch op on 2 threads adds its worker thread to the process), tracing a
bridged `tf.function` releases it (the worker thread exits), and
`TORCHBRIDGE_RELEASE_USER_TEAM=0` keeps it. Results stay right, and the
team comes back when the user's thread runs parallel torch code again.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import json, os, time
    import torch
    import tensorflow as tf
    import torchbridge as tb
    from torchbridge import _omp_team

    def threads():
      return len(os.listdir("/proc/self/task"))

    v = tf.ones([4, 3])                 # TF's context and pools are up
    torch.set_num_threads(2)
    x = torch.randn(512, 512)
    net = tb.TorchModule(torch.nn.Linear(3, 1), name="net")
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
  out = subprocess.run([sys.executable, "-c", CHILD], env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="counts threads in /proc")
def test_tracing_a_graph_call_releases_the_users_idle_team():
  result = run_child({})
  if result["with_team"] == result["before"]:
    pytest.skip("torch made no OpenMP worker here (no OpenMP build?)")
  assert result["releases"] >= 1
  assert result["after_trace"] < result["with_team"], result
  assert result["again"] > result["after_trace"], result
  assert result["equal"]


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="counts threads in /proc")
def test_the_release_can_be_turned_off():
  result = run_child({"TORCHBRIDGE_RELEASE_USER_TEAM": "0"})
  assert result["releases"] == 0
  assert result["after_trace"] >= result["with_team"], result
  assert result["equal"]
