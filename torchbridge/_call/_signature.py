"""Output signatures of torch code, found while a tf.function traces it.

First on torch's "meta" tensors (shape-only: nothing is computed). Code that
meta tensors cannot run (it reads values with `.item()` or `.tolist()`,
checks values, has data-dependent shapes, or uses an op without a meta
kernel) is then run for real on stand-in values of the traced shapes:
ones for the arguments (every integer 1: valid token ids, lengths, HF
attention masks and class indices; every bool False: torch's boolean masks
mask nothing) and the current values of a module's
parameters and buffers (`stand_ins`); then once more with random floating
arguments (integers stay 1), so that an output dimension that depends on
floating values (`x[x > 0]`) comes out unknown rather than wrong. The real
runs happen under `torch.no_grad()`, with torch's random state saved and
restored, so the traced calls draw the same random numbers as without them.

Unknown TF dimensions are tried at two sizes; an output dimension that
comes out the same for every run is static, one that changes stays unknown.
A dimension that depends on integer values can still come out wrong; such a
mismatch at run time fails the call with an error that names the way out
(`output_signature`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._frameworks import _compiled
from torchbridge._crossing import _adopt

# Two stand-in sizes for the dimensions TF leaves unknown. An output dimension
# that comes out the same for both is static; one that changes stays unknown.
_PROBE_SIZES = (2, 3)

# How the specs were found (for the errors of later calls).
META = "by running it on meta tensors"
REAL = "by running it on stand-in values (ones) of the traced shapes"
DECLARED = "by output_signature"

_BOTH_FAILED = """\
torchbridge could not find the output shapes of {name} while tracing the
tf.function. On "meta" tensors (torch's shape-only device) it failed with
  {meta_type}: {meta_error}
and on stand-in values (ones) of the traced shapes with
  {real_type}: {real_error}
Declare the outputs instead, with TensorSpecs in the structure the function
returns and None for unknown dimensions, e.g.
  tb.torch_function(fn, output_signature=tf.TensorSpec([None, 4], tf.float32))
  tb.TorchModule(module, output_signature=tf.TensorSpec([None, 4], tf.float32))"""

_TRACE_FAILED = """\
{name} failed while tf.function traced it (torchbridge runs the torch code
{how} to learn its output shapes), on tensor arguments of shapes and dtypes
{inputs}{parameters}:
  {error_type}: {error}"""


def _is_meta_limitation(err: BaseException) -> bool:
  """Whether `err` comes from the meta device itself, not from the inputs."""
  return isinstance(err, NotImplementedError) or "meta" in str(err).lower()


def _same_type(err: BaseException, message: str) -> BaseException:
  try:
    return type(err)(message)
  except Exception:  # an exception type whose constructor wants more
    return RuntimeError(message)


class ResultError(TypeError):
  """The torch code returned something torchbridge cannot hand to TF."""

  # AutoGraph re-raises errors from traced code with a longer message, and
  # turns exception types it cannot rebuild that way into a StagingError
  # (no longer a TypeError). It rebuilds those with Exception's constructor.
  __init__ = Exception.__init__


def infer(
  run: Callable[[list[torch.Tensor]], list[torch.Tensor]],
  args_specs: Sequence[tf.TensorSpec],
  name: str,
  stand_ins: Sequence[Callable[[], torch.Tensor] | None] | None = None,
) -> tuple[list[tf.TensorSpec], str]:
  """Runs `run` on stand-ins of `args_specs`; its outputs' TensorSpecs.

  Args:
    run: `run(args_torch) -> list of torch tensors`.
    args_specs: `tf.TensorSpec`s of the arguments, possibly with unknown
      dimensions.
    name: the function's name, for errors.
    stand_ins: optional list, one per argument: None, or a callable
      returning the real torch tensor to use for it (a module's weights)
      when the code must run for real.

  Returns:
    (one `tf.TensorSpec` per output, how they were found: META or REAL).
  """
  unknown_rank = [s for s in args_specs if s.shape.rank is None]
  if unknown_rank:
    raise ValueError(
      f"{name} got an argument of unknown rank inside tf.function "
      f"({unknown_rank[0]}), so torchbridge cannot find its output shapes. "
      "Give the tf.function an input_signature with known ranks, or declare "
      "the outputs: tb.TorchModule(..., output_signature=...) or "
      "tb.torch_function(..., output_signature=...)."
    )
  probes = probe_sizes(args_specs)
  try:
    outs = [_run_meta(run, args_specs, size) for size in probes]
    how = META
  except ResultError:
    raise  # the result itself is wrong: output_signature would not help
  except Exception as meta_err:  # any failure of user code on meta tensors
    try:
      with torch.random.fork_rng(devices=[]):
        outs = [_run_real(run, args_specs, size, stand_ins) for size in probes]
        try:
          outs.append(_run_real(run, args_specs, probes[0], stand_ins, random_floats=True))
        except Exception:  # pylint: disable=broad-except
          # The code wants its floating values as they were: the shapes
          # seen so far stand.
          pass
      how = REAL
    except ResultError:
      raise
    except Exception as real_err:  # pylint: disable=broad-except
      if not _is_meta_limitation(meta_err):
        # The inputs' own error (a wrong shape or dtype), in its own type.
        raise _trace_error(meta_err, name, args_specs, META, stand_ins) from meta_err
      raise RuntimeError(
        _BOTH_FAILED.format(
          name=name,
          meta_type=type(meta_err).__name__,
          meta_error=_one_line(meta_err),
          real_type=type(real_err).__name__,
          real_error=_one_line(real_err),
        )
      ) from real_err
  return specs_of_runs(outs, name), how


def probe_sizes(args_specs: Sequence[tf.TensorSpec]) -> tuple[int, ...]:
  """The stand-in sizes to run at: two where a dimension is unknown (an
  output dimension that changes between them stays unknown), else one."""
  dynamic = any(None in s.shape.as_list() for s in args_specs)
  return _PROBE_SIZES if dynamic else _PROBE_SIZES[:1]


def _shape(spec: tf.TensorSpec, size: int) -> list[int]:
  return [size if d is None else d for d in spec.shape.as_list()]


def _run_meta(
  run: Callable[[list[torch.Tensor]], list[torch.Tensor]],
  args_specs: Sequence[tf.TensorSpec],
  size: int,
) -> list[torch.Tensor]:
  args_meta = [
    torch.empty(_shape(s, size), dtype=_adopt.torch_dtype(s.dtype), device="meta")
    for s in args_specs
  ]
  with torch.no_grad(), _compiled.run_uncompiled():
    return run(args_meta)


def _run_real(
  run: Callable[[list[torch.Tensor]], list[torch.Tensor]],
  args_specs: Sequence[tf.TensorSpec],
  size: int,
  stand_ins: Sequence[Callable[[], torch.Tensor] | None] | None,
  random_floats: bool = False,
) -> list[torch.Tensor]:
  args = stand_in_args(args_specs, size, stand_ins, random_floats)
  with torch.no_grad(), _compiled.run_uncompiled():
    return run(args)


def stand_in_args(
  args_specs: Sequence[tf.TensorSpec],
  size: int,
  stand_ins: Sequence[Callable[[], torch.Tensor] | None] | None = None,
  random_floats: bool = False,
) -> list[torch.Tensor]:
  """Torch tensors to run a forward on for real while tracing: each
  argument's stand-in where given (a module's weights), else ones (zeros
  for bools; with `random_floats`, seeded normal floats) of its spec's
  shape, `size` for each unknown dimension."""
  args = []
  generator = torch.Generator().manual_seed(0)
  for k, spec in enumerate(args_specs):
    make = stand_ins[k] if stand_ins else None
    dtype = _adopt.torch_dtype(spec.dtype)
    if make is not None:
      args.append(make())
    elif random_floats and dtype.is_floating_point:
      args.append(torch.randn(_shape(spec, size), generator=generator, dtype=dtype))
    elif dtype is torch.bool:
      args.append(torch.zeros(_shape(spec, size), dtype=dtype))
    else:
      args.append(torch.ones(_shape(spec, size), dtype=dtype))
  return args


def _trace_error(
  err: BaseException,
  name: str,
  args_specs: Sequence[tf.TensorSpec],
  how: str,
  stand_ins: Sequence[Callable[[], torch.Tensor] | None] | None,
) -> BaseException:
  # An error the inputs would cause on real tensors too (a wrong shape or
  # dtype): the user's error, in its own type, said to come from tracing.
  # The module's parameters and buffers (those with a stand-in) are op
  # inputs too, but not the caller's arguments: they are counted apart.
  own = [s for i, s in enumerate(args_specs) if not (stand_ins and stand_ins[i] is not None)]
  held = len(args_specs) - len(own)
  return _same_type(
    err,
    _TRACE_FAILED.format(
      name=name,
      how=how,
      error_type=type(err).__name__,
      error=err,
      inputs=", ".join(f"{tuple(s.shape)} {s.dtype.name}" for s in own) or "(none)",
      parameters=f" (and the module's {held} parameters and buffers)" if held else "",
    ),
  )


def _one_line(err: BaseException) -> str:
  text = " ".join(str(err).split())
  return text if len(text) <= 300 else text[:297] + "..."


def specs_of_runs(
  outs_by_probe: Sequence[Sequence[torch.Tensor]], name: str
) -> list[tf.TensorSpec]:
  """One spec per output of runs at `probe_sizes`: a dimension the runs
  agree on is static, one that changes is unknown."""
  specs = []
  for k, outs in enumerate(zip(*outs_by_probe)):
    if not _adopt.has_tf_dtype(outs[0].dtype):
      raise ResultError(
        f"{name} returned a torch tensor of dtype {outs[0].dtype} as "
        f"output {k}, which TF lacks. Cast it to a dtype TF has first, "
        "e.g. `x.to(torch.float32)`."
      )
    shapes = [list(o.shape) for o in outs]
    if len({len(s) for s in shapes}) > 1:
      shape = None  # even the rank depends on the unknown dimensions
    else:
      shape = [dims[0] if len(set(dims)) == 1 else None for dims in zip(*shapes)]
    specs.append(tf.TensorSpec(shape, _adopt.tf_dtype(outs[0].dtype)))
  return specs
