"""Output shapes under XLA, found when XLA compiles a call.

A call traced with unknown dimensions (Keras traces its steps with an
unknown batch; an `input_signature` may leave any dimension unknown)
declares partial output shapes. XLA compiles each cluster for concrete
input shapes, and the op's XLA kernel (csrc/xla/xla_call.cc) then asks,
through the op library (csrc/host_call.cc) and `_callbacks.output_shapes`,
the function registered beside the op's callback for its output shapes at
those shapes. The functions here: a forward's (torch on meta tensors, as
`_signature.infer` runs it while tracing, or the C++ runner's exported
graph on meta tensors) and a backward's (the shapes of what it
differentiates, carried to it by empty tensors). Each merges what it finds
with the declared shapes, and says so where torch cannot tell a shape from
the input shapes alone. Unknown ranks are refused when the call is traced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._call import _protocol
from torchbridge._call import _signature
from torchbridge._native import _exported_program

# `shapes(input specs, declared output shapes) -> output shapes`, all known.
OutputShapes = Callable[[list[tf.TensorSpec], list[tf.TensorShape]], list[tf.TensorShape]]

_UNKNOWN_RANK = """\
{name}: its {what} {k} has an unknown rank ({shape}) under XLA
(jit_compile=True), where torchbridge finds the outputs' shapes when XLA
compiles the call, from its arguments' ranks and shapes. Give the
tf.function an input_signature with known ranks (dimensions may be None),
declare the outputs with known ranks (output_signature), or compile
without XLA (jit_compile=False)."""

_CANNOT_SAY = """\
{name}: under XLA (jit_compile=True) torchbridge finds each output's shape
when XLA compiles the call, for the shapes of its arguments, here {inputs};
torch cannot say the shape of its output {k} from those: it comes out
{found}, a size that depends on the values (e.g. `x[x > 0]`), and XLA fixes
every buffer's size before it runs. Return a size that follows from the
input shapes (e.g. `torch.where(x > 0, x, 0)` instead of `x[x > 0]`), or
compile without XLA (jit_compile=False)."""

_DISAGREE = """\
{name}: its output {k} was declared {declared} when the call was traced, but
torch gives {found} on arguments of shapes {inputs} when XLA compiles it.
Correct the output_signature, or leave it out (torchbridge then finds the
output shapes itself)."""


def check_ranks(
  name: str, args_tf: Sequence[tf.Tensor], out_specs: Sequence[tf.TensorSpec]
) -> None:
  """Raises, naming the fix, unless every argument and output of a call
  under XLA has a known rank (unknown dimensions are found later)."""
  for what, shapes in (
    ("argument", [a.shape for a in args_tf]),
    ("output", [s.shape for s in out_specs]),
  ):
    for k, shape in enumerate(shapes):
      if shape.rank is None:
        raise ValueError(_UNKNOWN_RANK.format(name=name, what=what, k=k, shape=shape))


def all_known(shapes: Sequence[Any]) -> bool:
  return all(tf.TensorShape(s).is_fully_defined() for s in shapes)


def of_call(
  name: str,
  forward: _protocol.Forward,
  args_tf: Sequence[tf.Tensor],
  out_specs: Sequence[tf.TensorSpec],
  given: OutputShapes | None,
) -> OutputShapes | None:
  """For a graph call under XLA (`_graph.call_graph`), whose op returns a
  handle and `out_specs`: checks the ranks; where some output shape is not
  fully known, the function that finds them, `given` or `forward` on meta
  tensors; None where all are known."""
  check_ranks(name, args_tf, out_specs)
  if all_known([s.shape for s in out_specs]):
    return None

  def run(args_torch: list[torch.Tensor]) -> list[torch.Tensor]:
    # Every output computed: no `unused` is passed.
    return cast("list[torch.Tensor]", list(forward(args_torch, record=False).outs_torch))

  return given or forward_shapes(run, name, 1)


def forward_shapes(
  run: Callable[[list[torch.Tensor]], list[torch.Tensor]], name: str, lead: int
) -> OutputShapes:
  """The output shapes of an op running `run(args_torch) -> outputs`, whose
  first `lead` outputs (a handle) are declared with known shapes: `run` on
  meta tensors of the concrete input shapes (on stand-in values where meta
  tensors cannot run it, as while tracing)."""

  def find(specs: list[tf.TensorSpec], declared: list[tf.TensorShape]) -> list[tf.TensorShape]:
    found, _ = _signature.infer(run, specs, name)
    return merge(name, declared[:lead] + [s.shape for s in found], declared, specs, lead)

  return find


def carriers(tensors_tf: Sequence[tf.Tensor]) -> list[tf.Tensor]:
  """An empty tensor per tensor, of its shape and one more dimension, 0:
  an input of a backward op that tells XLA's compiler the shape of a
  gradient (no bytes to copy)."""
  return [tf.expand_dims(t, -1)[..., :0] for t in tensors_tf]


def carried_shapes(name: str, lead: int) -> OutputShapes:
  """The output shapes of a backward op whose last inputs are `carriers`,
  one per gradient it returns, after `lead` outputs of known shape."""

  def find(specs: list[tf.TensorSpec], declared: list[tf.TensorShape]) -> list[tf.TensorShape]:
    n = len(declared) - lead
    found = [s.shape[:-1] for s in specs[len(specs) - n :]]
    return merge(name, declared[:lead] + found, declared, specs, lead)

  return find


def merge(
  name: str,
  found: Sequence[tf.TensorShape],
  declared: Sequence[tf.TensorShape],
  specs: Sequence[tf.TensorSpec],
  lead: int,
) -> list[tf.TensorShape]:
  """The declared shapes with their unknown dimensions `found`; raises,
  naming the output (counted after the `lead` ones), where the two
  disagree or torch left a dimension unknown."""
  inputs = ", ".join(str(s.shape.as_list()) for s in specs) or "none"
  merged = []
  for k, (want, got) in enumerate(zip(declared, found)):
    if not want.is_compatible_with(got):
      raise ValueError(
        _DISAGREE.format(
          name=name, k=k - lead, declared=want.as_list(), found=got.as_list(), inputs=inputs
        )
      )
    shape = want.merge_with(got)
    if not shape.is_fully_defined():
      raise ValueError(
        _CANNOT_SAY.format(name=name, k=k - lead, found=shape.as_list(), inputs=inputs)
      )
    merged.append(shape)
  return merged


def exported_graph_runner(program: Any) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
  """`run(args_torch) -> outputs` of the C++ runner's exported program,
  node by node in Python (for its output shapes, on meta tensors): each
  ATen node as the runner calls it (a view as a reshape)."""
  graph, inputs = program.graph, program.inputs

  def run(args_torch: list[torch.Tensor]) -> list[torch.Tensor]:
    values = dict(zip(inputs, args_torch))

    def value(node: torch.fx.Node) -> Any:
      return values[node.name]

    for node in graph.nodes:
      if node.op == "call_function":
        target = node.target
        if target in _exported_program.AS_RESHAPE:
          target = torch.ops.aten.reshape.default
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), value)
        values[node.name] = target(*args, **kwargs)
      elif node.op == "output":
        return [values[n.name] for n in _exported_program.flat_outputs(node.args[0])]
    raise ValueError(f"the exported graph of {program!r} has no output node")

  return run
