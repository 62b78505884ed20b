"""Output signatures of torch code, found without computing anything."""

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge import _compiled
from torchbridge import _adopt

# Two stand-in sizes for the dimensions TF leaves unknown. An output dimension
# that comes out the same for both is static; one that changes stays unknown.
_PROBE_SIZES = (2, 3)

_META_FAILED = """\
torchbridge could not find the output shapes of {name} by running it on
"meta" tensors (torch's shape-only device) while tracing the tf.function:
  {error_type}: {error}
Code that reads tensor values (`.item()`, `.tolist()`, numpy), or whose output
shapes depend on the data, cannot run on meta tensors. Declare the outputs
instead, with TensorSpecs in the structure the function returns and None for
unknown dimensions, e.g.:
  tb.torch_function(fn, output_signature=tf.TensorSpec([None, 4], tf.float32))"""


_TRACE_FAILED = """\
{name} failed while tf.function traced it (torchbridge runs the torch code on
shape-only "meta" tensors to learn its output shapes), on arguments of shapes
and dtypes {inputs}:
  {error_type}: {error}"""


def _is_meta_limitation(err):
  """Whether `err` comes from the meta device itself, not from the inputs."""
  return isinstance(err, NotImplementedError) or "meta" in str(err).lower()


def _same_type(err, message):
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


def infer(run, args_specs, name):
  """Runs `run(args_meta)` on meta tensors, returns its outputs' TensorSpecs.

  Args:
    run: `run(args_torch) -> list of torch tensors`.
    args_specs: `tf.TensorSpec`s of the arguments, possibly with unknown
      dimensions.
    name: the function's name, for errors.

  Returns:
    One `tf.TensorSpec` per output.
  """
  unknown_rank = [s for s in args_specs if s.shape.rank is None]
  if unknown_rank:
    raise ValueError(
        f"{name} got an argument of unknown rank inside tf.function "
        f"({unknown_rank[0]}), so torchbridge cannot find its output shapes. "
        "Give the tf.function an input_signature with known ranks, or pass "
        "output_signature= to tb.torch_function.")
  dynamic = any(None in s.shape.as_list() for s in args_specs)
  probes = _PROBE_SIZES if dynamic else _PROBE_SIZES[:1]
  outs_by_probe = []
  for size in probes:
    args_meta = [
        torch.empty([size if d is None else d for d in s.shape.as_list()],
                    dtype=_adopt.torch_dtype(s.dtype), device="meta")
        for s in args_specs
    ]
    try:
      with torch.no_grad(), _compiled.run_uncompiled():
        outs_by_probe.append(run(args_meta))
    except ResultError:
      raise  # the result itself is wrong: output_signature would not help
    except Exception as err:  # any failure of user code on meta tensors
      if _is_meta_limitation(err):
        raise RuntimeError(_META_FAILED.format(
            name=name, error_type=type(err).__name__, error=err)) from err
      # An error the inputs would cause on real tensors too (a wrong shape
      # or dtype): the user's error, in its own type, said to come from
      # tracing.
      raise _same_type(err, _TRACE_FAILED.format(
          name=name, error_type=type(err).__name__, error=err,
          inputs=", ".join(f"{tuple(s.shape)} {s.dtype.name}"
                           for s in args_specs))) from err
  specs = []
  for k, outs in enumerate(zip(*outs_by_probe)):
    if not _adopt.has_tf_dtype(outs[0].dtype):
      raise ResultError(
          f"{name} returned a torch tensor of dtype {outs[0].dtype} as "
          f"output {k}, which TF lacks. Cast it to a dtype TF has first, "
          "e.g. `x.to(torch.float32)`.")
    shapes = [list(o.shape) for o in outs]
    if len({len(s) for s in shapes}) > 1:
      shape = None  # even the rank depends on the unknown dimensions
    else:
      shape = [dims[0] if len(set(dims)) == 1 else None
               for dims in zip(*shapes)]
    specs.append(tf.TensorSpec(shape, _adopt.tf_dtype(outs[0].dtype)))
  return specs
