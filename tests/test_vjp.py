"""`_vjp.vjp`: torch.autograd.grad's results and errors, with less overhead."""

import pytest
import torch

from torchbridge._call import _vjp


def _reference(outputs, inputs, grad_outputs, create_graph):
  return torch.autograd.grad(
    outputs,
    inputs,
    grad_outputs,
    retain_graph=True,
    create_graph=create_graph,
    allow_unused=True,
    materialize_grads=True,
  )


def _graph():
  torch.manual_seed(0)
  x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
  w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
  unused = torch.randn(2, dtype=torch.float64, requires_grad=True)
  h = torch.tanh(x @ w)
  return x, w, unused, [h, h.sum(1)]


def test_the_fast_path_is_taken_for_plain_tensors():
  _, w, _, outs = _graph()
  assert _vjp._ENGINE is not None
  assert _vjp._fast_path_applies(tuple(outs), (w,), tuple(torch.ones_like(o) for o in outs))


@pytest.mark.parametrize("create_graph", [False, True])
def test_equals_autograd_grad_with_unused_inputs_as_zeros(create_graph):
  x, w, unused, outs = _graph()
  dys = [torch.randn_like(o) for o in outs]
  got = _vjp.vjp(outs, [x, w, unused], dys, create_graph)
  want = _reference(outs, [x, w, unused], dys, create_graph)
  for g, r in zip(got, want):
    assert torch.equal(g, r)
    assert g.requires_grad == create_graph
  assert torch.equal(got[2], torch.zeros(2, dtype=torch.float64))
  # The graph is kept: a second product on it gives the same result.
  again = _vjp.vjp(outs, [x, w, unused], dys, create_graph)
  assert all(torch.equal(a, g) for a, g in zip(again, got))


def test_second_order_through_create_graph():
  x, w, _, outs = _graph()
  dys = [torch.ones_like(o) for o in outs]
  (gx,) = _vjp.vjp(outs, [x], dys, create_graph=True)
  (gxx_got,) = _vjp.vjp(
    [gx.sum()], [w], [torch.tensor(1.0, dtype=torch.float64)], create_graph=False
  )
  (gx_ref,) = torch.autograd.grad(outs, [x], dys, create_graph=True)
  (gxx_want,) = torch.autograd.grad(gx_ref.sum(), [w])
  torch.testing.assert_close(gxx_got, gxx_want, rtol=0, atol=0)


class _Logged(torch.Tensor):
  calls = []

  @classmethod
  def __torch_function__(cls, func, types, args=(), kwargs=None):
    cls.calls.append(getattr(func, "__name__", str(func)))
    return super().__torch_function__(func, types, args, kwargs or {})


def test_tensor_subclasses_go_through_autograd_grad():
  x = torch.ones(3, requires_grad=True)
  y = (x * 2).as_subclass(_Logged)
  assert not _vjp._fast_path_applies((y,), (x,), (torch.ones(3),))
  _Logged.calls.clear()
  (g,) = _vjp.vjp([y], [x], [torch.ones(3)], create_graph=False)
  assert torch.equal(g.as_subclass(torch.Tensor), torch.full([3], 2.0))
  assert "grad" in _Logged.calls  # torch.autograd.grad's own override path


def test_mismatched_upstream_gradient_shape_gets_torchs_own_error():
  x = torch.ones(3, requires_grad=True)
  y = x * 2
  with pytest.raises(RuntimeError) as want:
    _reference([y], [x], [torch.ones(4)], False)
  with pytest.raises(RuntimeError) as got:
    _vjp.vjp([y], [x], [torch.ones(4)], create_graph=False)
  assert str(got.value) == str(want.value)


def test_other_dtype_of_upstream_gradient_is_handled_as_torch_does():
  x = torch.ones(3, requires_grad=True)
  y = x * 2
  dy = torch.full([3], 0.5, dtype=torch.float64)
  assert not _vjp._fast_path_applies((y,), (x,), (dy,))
  (got,) = _vjp.vjp([y], [x], [dy], create_graph=False)
  (want,) = _reference([y], [x], [dy], False)
  assert got.dtype == want.dtype and torch.equal(got, want)


def test_input_without_grad_gets_torchs_error():
  x = torch.ones(3, requires_grad=True)
  frozen = torch.ones(3)
  y = x * frozen
  with pytest.raises(RuntimeError, match="does not require grad"):
    _vjp.vjp([y], [x, frozen], [torch.ones(3)], create_graph=False)
