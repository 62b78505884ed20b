"""Property-based tests at the TF/torch boundary (Hypothesis).

Hypothesis generates dtypes, shapes (0-d, empty and size-1 dimensions, up
to 6-d), torch and numpy layouts (transposes, stepped slices, misaligned
starts, expanded and odd-strided size-1 dimensions, lazy conjugate and
negative views), nests (lists, tuples, dicts, namedtuples, dataclasses,
None and static leaves) and modes (eager, `tf.function`, `tf.function` with
None dimensions), for `to_torch` / `to_tf`, `torch_function` and
`TorchModule`. The properties: bits equal; memory shared exactly when the
documented rule allows it (tests/_property_worker.py, `case_to_tf_view`),
else one copy counted in `exchange_stats()`; gradients equal torch autograd;
refusals raise the documented TypeError naming the function and the kind.

Never a crash: every generated case runs in one persistent child process
(tests/_property_worker.py) that inherits the environment, so the
`TORCHBRIDGE_DISABLE_NATIVE=1` pass runs it on the `tf.py_function` path. A
case that kills the child by a signal fails that example with a reproducer
(a command line) and the child is restarted.

Profiles: "ci" (default: about 2,700 examples, reproducible: derandomized,
no example database), "long" (`HYPOTHESIS_PROFILE=long`, 15x more) and
"quick" (a tenth of ci, while developing).
`--hypothesis-show-statistics` prints each test's count.
"""

import os
import shlex
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures(
  "bridge_runner"
)  # graph calls on the torch runner: these test the bridge

WORKER = Path(__file__).with_name("_property_worker.py")

settings.register_profile(
  "ci",
  derandomize=True,
  database=None,
  deadline=None,
  print_blob=True,
  max_examples=100,
  suppress_health_check=[
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.function_scoped_fixture,
  ],
)
# A nightly-style run: new examples each time (a failure prints the seed
# blob that replays it, `@reproduce_failure`).
settings.register_profile("long", settings.get_profile("ci"), max_examples=1500, derandomize=False)
# A quick look while developing: a tenth of ci.
settings.register_profile("quick", settings.get_profile("ci"), max_examples=10)
PROFILE_NAME = os.environ.get("HYPOTHESIS_PROFILE", "ci")
PROFILE = settings.get_profile(PROFILE_NAME if PROFILE_NAME in ("ci", "long", "quick") else "ci")
SCALE = PROFILE.max_examples / 100


def examples(n):
  """`n` examples in the ci profile, scaled in the others."""
  return settings(PROFILE, max_examples=max(1, int(n * SCALE)))


# --- The worker process. ---


class WorkerCrashed(AssertionError):
  """The worker died (a signal, an abort) or hung while running a case."""


class Worker:
  """The persistent child that runs cases (one per test module)."""

  START_TIMEOUT_S = 300
  CASE_TIMEOUT_S = 300

  def __init__(self):
    self.starts = 0
    self._start()

  def _start(self):
    child_in, parent_out = os.pipe()
    parent_in, child_out = os.pipe()
    # The environment as it is: TORCHBRIDGE_DISABLE_NATIVE reaches the child.
    self._proc = subprocess.Popen(
      [sys.executable, str(WORKER), str(child_in), str(child_out)],
      pass_fds=(child_in, child_out),
      env=dict(os.environ),
    )
    os.close(child_in)
    os.close(child_out)
    self._requests = Connection(parent_out, readable=False)
    self._replies = Connection(parent_in, writable=False)
    self.starts += 1
    status, self.disable_native = self._reply(self.START_TIMEOUT_S, "starting the worker")
    assert status == "ready", status

  def close(self):
    self._requests.close()
    try:
      self._proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()
    self._replies.close()

  def _restart(self):
    if self._proc.poll() is None:
      self._proc.kill()
    self._proc.wait()
    self._requests.close()
    self._replies.close()
    self._start()

  def _reply(self, timeout, what):
    if not self._replies.poll(timeout):
      raise WorkerCrashed(f"the worker hung for {timeout} s while {what}")
    try:
      return self._replies.recv()
    except EOFError:
      code = self._proc.wait()
      how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
      raise WorkerCrashed(f"the worker died ({how}) while {what}") from None

  def run(self, case, spec):
    """Runs one case; returns what it returns, raises AssertionError with
    the worker's traceback and a reproducer when it fails."""
    spec_text = repr(spec)
    quoted = f'"{spec_text}"' if not set('"$`\\!') & set(spec_text) else shlex.quote(spec_text)
    replay = f"{shlex.quote(sys.executable)} tests/_property_worker.py --replay {case} {quoted}"
    try:
      self._requests.send((case, spec))
      status, result = self._reply(self.CASE_TIMEOUT_S, f"running {case}")
    except (WorkerCrashed, BrokenPipeError, OSError) as err:
      self._restart()
      raise WorkerCrashed(f"{err}\nReproduce with:\n  {replay}") from None
    if status != "ok":
      raise AssertionError(f"{result}\nReproduce with:\n  {replay}")
    return result


@pytest.fixture(scope="module")
def worker():
  started = Worker()
  yield started
  started.close()


# --- Strategies: everything drawn is a Python literal, so a reproducer is a
# --- command line.

DTYPES = [
  "bool",
  "int8",
  "int16",
  "int32",
  "int64",
  "uint8",
  "uint16",
  "uint32",
  "uint64",
  "float16",
  "bfloat16",
  "float32",
  "float64",
  "complex64",
  "complex128",
]
ITEMSIZE = {
  "bool": 1,
  "int8": 1,
  "int16": 2,
  "int32": 4,
  "int64": 8,
  "uint8": 1,
  "uint16": 2,
  "uint32": 4,
  "uint64": 8,
  "float16": 2,
  "bfloat16": 2,
  "float32": 4,
  "float64": 8,
  "complex64": 8,
  "complex128": 16,
}
FLOATS = ["float16", "bfloat16", "float32", "float64"]
COMPLEX = ["complex64", "complex128"]
SIGNED = ["int8", "int16", "int32", "int64"] + FLOATS + COMPLEX

seeds = st.integers(0, 2**16)
fills = st.sampled_from(["bits", "normal", "zeros"])


def shapes(max_rank=6, min_rank=0):
  """0-d to 6-d; empty and size-1 dimensions often; at most a few hundred
  elements."""

  def dims(rank):
    sizes = [0, 1, 1, 2, 3, 4, 5] if rank <= 3 else [0, 1, 1, 2, 3]
    return st.lists(st.sampled_from(sizes), min_size=rank, max_size=rank)

  return st.integers(min_rank, max_rank).flatmap(dims).map(tuple)


@st.composite
def torch_views(draw):
  """A torch view as `as_strided(shape, strides, offset)` of a fresh
  (64-byte aligned) storage: a permutation of a stepped row-major layout
  (transposes, slices with steps), expanded (stride 0) dimensions, odd
  strides on size-1 dimensions, a storage offset (misaligned starts), and
  lazy conjugate / negative views and requires_grad where the dtype allows."""
  name = draw(st.sampled_from(DTYPES))
  shape = draw(shapes())
  rank = len(shape)
  perm = draw(st.permutations(range(rank)))
  steps = draw(st.lists(st.sampled_from([1, 1, 1, 2, 3]), min_size=rank, max_size=rank))
  strides = [0] * rank
  extent = 1
  for d in reversed(perm):
    strides[d] = extent * steps[d]
    extent *= max(shape[d], 1) * steps[d]
  for d in range(rank):
    if shape[d] > 1 and draw(st.integers(0, 9)) == 0:
      strides[d] = 0  # expanded
    elif shape[d] == 1:
      strides[d] = draw(st.sampled_from([strides[d], strides[d], 0, 7, 99]))
  aligned_step = 64 // ITEMSIZE[name]
  # Aligned, any, and half-aligned starts (32 bytes: aligned for most
  # kernels, not for TF's).
  offset = draw(
    st.one_of(
      st.just(0),
      st.integers(1, 40),
      st.integers(1, 3).map(lambda k: k * aligned_step),
      st.just(max(aligned_step // 2, 1)),
    )
  )
  spec = {
    "dtype": name,
    "shape": shape,
    "strides": tuple(strides),
    "offset": offset,
    "seed": draw(seeds),
    "fill": draw(fills),
  }
  if name in COMPLEX:
    spec["conj"] = draw(st.booleans())
  if name in SIGNED:
    spec["neg"] = draw(st.integers(0, 4)) == 0
  if name in FLOATS:
    spec["requires_grad"] = draw(st.booleans())
  return spec


@st.composite
def numpy_views(draw, dtypes=tuple(d for d in DTYPES if d != "bfloat16")):
  """A numpy view (bfloat16 arrays: test_numpy_bfloat16_arrays_cross)."""
  name = draw(st.sampled_from(dtypes))
  shape = draw(shapes(max_rank=4))
  rank = len(shape)
  return {
    "dtype": name,
    "shape": shape,
    "steps": tuple(
      draw(st.lists(st.sampled_from([1, 1, 2, -1, -2]), min_size=rank, max_size=rank))
    ),
    "perm": tuple(draw(st.permutations(range(rank)))),
    "byte_offset": draw(st.sampled_from([0, 0, 1, 3, 64])),
    "read_only": draw(st.integers(0, 3)) == 0,
    "seed": draw(seeds),
    "fill": draw(fills),
  }


def tensor_leaves(kinds=("tensor", "variable", "torch")):
  return st.fixed_dictionaries(
    {
      "kind": st.sampled_from(kinds),
      "dtype": st.sampled_from(DTYPES),
      "shape": shapes(max_rank=3),
      "seed": seeds,
    }
  )


@st.composite
def nests(draw, leaves, boxes=True, depth=3):
  """Nest descriptions (see `build_nest` in the worker). A composite, not
  `st.recursive`, whose repr grows past Hypothesis' limit in long runs."""
  kinds = ["tensor", "tensor", "none", "static"]
  if depth:
    kinds += ["list", "tuple", "point", "dict"] + (["box"] if boxes else [])
  kind = draw(st.sampled_from(kinds))
  if kind == "tensor":
    return ("tensor", draw(leaves))
  if kind == "none":
    return ("none",)
  if kind == "static":
    return ("static", draw(st.sampled_from([3, "label", 2.5])))
  child = nests(leaves, boxes, depth - 1)
  if kind in ("list", "tuple"):
    return (kind, draw(st.lists(child, max_size=3)))
  if kind == "point":
    return ("point", [draw(child), draw(child)])
  if kind == "dict":
    return (
      "dict",
      draw(
        st.lists(
          st.tuples(st.sampled_from(["a", "obs", "z", "b1"]), child),
          max_size=3,
          unique_by=lambda kv: kv[0],
        )
      ),
    )
  return ("box", [draw(child)])


# --- Tensor exchange. ---


@examples(700)
@given(spec=torch_views())
def test_to_tf_of_torch_views(worker, spec):
  worker.run("to_tf_view", spec)


@examples(300)
@given(
  spec=st.fixed_dictionaries(
    {
      "dtype": st.sampled_from(DTYPES),
      "shape": shapes(),
      "seed": seeds,
      "fill": fills,
      "kind": st.sampled_from(["tensor", "variable"]),
    }
  )
)
def test_to_torch_of_tf_tensors(worker, spec):
  worker.run("to_torch", spec)


@examples(300)
@given(spec=numpy_views())
def test_numpy_arrays(worker, spec):
  worker.run("numpy", spec)


def test_numpy_bfloat16_arrays_cross(worker):
  worker.run(
    "numpy",
    {
      "dtype": "bfloat16",
      "shape": (2, 3),
      "steps": (1, 1),
      "perm": (0, 1),
      "byte_offset": 0,
      "read_only": False,
      "seed": 0,
      "fill": "bits",
    },
  )


@examples(250)
@given(nest=nests(tensor_leaves()))
def test_nests_round_trip(worker, nest):
  worker.run("nest", {"nest": nest})


# --- torch_function. ---

OPS = {  # op -> (dtypes it takes, smallest rank); as in the worker
  "identity": (DTYPES, 0),
  "clone": (DTYPES, 0),
  "transpose": (DTYPES, 1),
  "step_slice": (DTYPES, 1),
  "misaligned": (DTYPES, 0),
  "sin": (FLOATS + COMPLEX, 0),
  "poly": (SIGNED + ["uint8"], 0),
  "sum_last": (SIGNED + ["uint8", "bool"], 1),
  "product": (SIGNED + ["uint8"], 0),
  "scale_by_int": (FLOATS, 0),
  "nest": (DTYPES, 0),
}


@st.composite
def function_calls(draw, mode):
  op = draw(st.sampled_from(sorted(OPS)))
  dtypes, min_rank = OPS[op]
  name = draw(st.sampled_from(dtypes))
  shape = draw(shapes(max_rank=4, min_rank=max(min_rank, 1 if mode == "function_none" else 0)))
  grad = draw(st.booleans())
  # Subnormal values too, in every mode: TF's threads flush them to zero, and
  # the bridge keeps them there as torch does (test_graph_mode_keeps_subnormals).
  fill = draw(fills)
  spec = {
    "op": op,
    "dtype": name,
    "shape": shape,
    "seed": draw(seeds),
    "fill": "normal" if grad else fill,
    "grad": grad,
    "mode": mode,
  }
  if mode == "function_none":
    spec["none_dims"] = tuple(sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
  return spec


@pytest.mark.parametrize("mode,n", [("eager", 350), ("function", 150), ("function_none", 100)])
def test_torch_function(worker, mode, n):
  @examples(n)
  @given(spec=function_calls(mode))
  def check(spec):
    worker.run("torch_function", spec)

  check()


@pytest.mark.parametrize("mode,n", [("eager", 150), ("function", 60)])
def test_torch_function_counts_each_crossing(worker, mode, n):
  @examples(n)
  @given(spec=function_calls(mode))
  def check(spec):
    # Both paths count exactly the user's tensors (the tf.py_function path
    # leaves its internal handle out: test_graph_call_counts_only_user_tensors).
    spec["count_zero_copy"] = True
    worker.run("function_stats", spec)

  check()


def test_graph_call_counts_only_user_tensors(worker):
  worker.run(
    "function_stats",
    {
      "op": "clone",
      "dtype": "float32",
      "shape": (3,),
      "seed": 0,
      "fill": "normal",
      "grad": False,
      "mode": "function",
    },
  )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_graph_mode_keeps_subnormals(worker, dtype):
  worker.run("subnormals", {"dtype": dtype})


# --- TorchModule. ---


@st.composite
def module_calls(draw, mode):
  kind = draw(st.sampled_from(["linear", "mlp", "batchnorm", "layernorm", "embedding"]))
  min_batch_rank = 1 if mode == "function_none" or kind == "batchnorm" else 0
  batch_rank = draw(st.integers(min_batch_rank, 1 if kind == "batchnorm" else 2))
  low = 2 if kind == "batchnorm" else 0
  batch = tuple(draw(st.lists(st.integers(low, 4), min_size=batch_rank, max_size=batch_rank)))
  if kind == "embedding" and not batch:
    batch = (3,)
  return {
    "module": kind,
    "dtype": draw(st.sampled_from(["float32", "float64"])),
    "width": draw(st.integers(1, 4)),
    "out": draw(st.integers(1, 4)),
    "bias": draw(st.booleans()),
    "batch": batch,
    "training": draw(st.sampled_from([None, True, False])),
    "seed": draw(seeds),
    "mode": mode,
  }


@pytest.mark.parametrize("mode,n", [("eager", 80), ("function", 40), ("function_none", 30)])
def test_torch_module(worker, mode, n):
  @examples(n)
  @given(spec=module_calls(mode))
  def check(spec):
    worker.run("torch_module", spec)

  check()


# --- Refusals. ---

REFUSED = {
  "to_torch": ["string", "ragged", "sparse", "numpy_str"],
  "to_tf": ["sparse", "meta", "quantized", "float8"],
  "torch_function": ["string", "ragged", "sparse", "numpy_str"],
}


@st.composite
def refusals(draw):
  side = draw(st.sampled_from(sorted(REFUSED)))
  kinds = ("tensor",) if side == "torch_function" else ("tensor", "torch")
  inner = draw(nests(tensor_leaves(kinds), boxes=False))
  # The refused leaf goes to the first tensor leaf: in `inner`, or this one.
  leaf = ("tensor", draw(tensor_leaves(kinds)))
  nest = draw(
    st.sampled_from(
      [
        leaf,
        ("list", [inner, leaf]),
        ("tuple", [leaf, inner]),
        ("point", [inner, leaf]),
        ("dict", [("obs", inner), ("z", leaf)]),
      ]
    )
  )
  return {
    "side": side,
    "kind": draw(st.sampled_from(REFUSED[side])),
    "nest": nest,
    "traced": draw(st.booleans()),
  }


@examples(200)
@given(spec=refusals())
def test_refusals(worker, spec):
  worker.run("refusal", spec)


@examples(30)
@given(
  spec=st.fixed_dictionaries(
    {"dtype": st.sampled_from(DTYPES), "shape": shapes(max_rank=3), "nested": st.booleans()}
  )
)
def test_to_torch_refuses_symbolic_tensors(worker, spec):
  worker.run("symbolic", spec)


@pytest.mark.parametrize("side", ["to_torch", "torch_function"])
def test_refusal_names_the_refused_argument(worker, side):
  worker.run("refusal_names_argument", {"side": side, "path": "['obs'][1]"})


# --- The harness itself. ---


def test_worker_inherits_the_environment(worker):
  assert worker.disable_native == os.environ.get("TORCHBRIDGE_DISABLE_NATIVE")


@pytest.mark.parametrize("how", ["abort", "kill"])
def test_a_crash_fails_one_example_and_the_worker_restarts(worker, how):
  starts = worker.starts
  with pytest.raises(WorkerCrashed) as info:
    worker.run("crash", {"how": how})
  message = str(info.value)
  signal_number = 6 if how == "abort" else 9
  assert f"killed by signal {signal_number}" in message
  assert "--replay crash" in message and repr({"how": how}) in message
  assert worker.starts == starts + 1
  assert worker.run(
    "to_torch", {"dtype": "float32", "shape": (2,), "seed": 0, "fill": "bits", "kind": "tensor"}
  ) == {"shared": True}


def test_a_failing_property_reports_the_worker_traceback(worker):
  with pytest.raises(AssertionError) as info:
    worker.run(
      "to_tf_view",
      {
        "dtype": "float32",
        "shape": (2,),
        "strides": (1,),
        "offset": 0,
        "seed": 0,
        "fill": "bits",
        "conj": "claims a copy",
      },
    )
  assert "Traceback" in str(info.value) and "--replay to_tf_view" in str(info.value)
