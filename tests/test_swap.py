"""`_swap.TensorSlots`: functional_call's result, with the slots found once."""

import copy

import pytest
import torch
from torch.func import functional_call

from torchbridge._state import _swap


class _Shared(torch.nn.Module):
  """A submodule used twice, a tied weight, a missing bias and a buffer."""

  def __init__(self):
    super().__init__()
    torch.manual_seed(0)
    self.block = torch.nn.Linear(4, 4)
    self.seq = torch.nn.Sequential(self.block, torch.nn.Tanh(), self.block)
    self.head = torch.nn.Linear(4, 4, bias=False)
    self.tail = torch.nn.Linear(4, 4, bias=False)
    self.tail.weight = self.head.weight  # tied
    self.register_buffer("scale", torch.tensor(2.0))

  def forward(self, x):
    return self.tail(self.head(self.seq(x))) * self.scale


def _fresh_values(module):
  """New tensors for every canonical parameter and buffer."""
  names = [n for n, _ in module.named_parameters()]
  names += [n for n, _ in module.named_buffers()]
  own = dict(module.named_parameters())
  own.update(module.named_buffers())
  return names, {n: torch.randn_like(own[n]) for n in names}


def test_equals_functional_call_and_restores_the_modules_own_tensors():
  net = _Shared()
  names, values = _fresh_values(net)
  assert "tail.weight" not in names and "head.weight" in names  # tied once
  own = {id(t) for t in list(net.parameters()) + list(net.buffers())}
  x = torch.randn(3, 4)
  slots = _swap.TensorSlots(net, names)
  got, reassigned = slots.call(values, (x,), {})
  # On a copy: torch 2.13's functional_call leaves a submodule that is
  # registered under two paths (`block`, `seq.0`, `seq.2`) holding the
  # passed tensors after the call.
  want = functional_call(copy.deepcopy(net), values, (x,))
  assert torch.equal(got, want) and not reassigned
  # Every place of every tensor was swapped for the call and back after it.
  assert {id(t) for t in list(net.parameters()) + list(net.buffers())} == own
  assert net.seq[0] is net.block and net.seq[2] is net.block
  assert net.head.bias is None and net.tail.weight is net.head.weight
  # By hand, with the new values at every place: the shared block twice,
  # the tied weight in the head and the tail.
  lin = torch.nn.functional.linear
  h = lin(x, values["block.weight"], values["block.bias"])
  h = lin(torch.tanh(h), values["block.weight"], values["block.bias"])
  h = lin(lin(h, values["head.weight"]), values["head.weight"])
  torch.testing.assert_close(got, h * values["scale"], rtol=0, atol=0)


def test_gradients_reach_the_substituted_tensors():
  net = _Shared()
  names, values = _fresh_values(net)
  values = {n: v.requires_grad_() for n, v in values.items() if v.is_floating_point()}
  x = torch.randn(3, 4)
  out, _ = _swap.TensorSlots(net, names).call(values, (x,), {})
  grads = torch.autograd.grad(out.sum(), [values[n] for n in names])
  want = torch.autograd.grad(functional_call(net, values, (x,)).sum(), [values[n] for n in names])
  for g, w in zip(grads, want):
    assert torch.equal(g, w)
  assert all(p.grad is None for p in net.parameters())


def test_an_exception_in_the_forward_restores_the_modules_tensors():
  class Failing(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
      raise ValueError("forward failed on purpose")

  net = Failing()
  own_weight = net.lin.weight
  slots = _swap.TensorSlots(net, ["lin.weight", "lin.bias"])
  with pytest.raises(ValueError, match="on purpose"):
    slots.call(
      {"lin.weight": torch.zeros(2, 2), "lin.bias": torch.zeros(2)}, (torch.ones(1, 2),), {}
    )
  assert net.lin.weight is own_weight


def test_a_replaced_buffer_is_reported_and_the_original_put_back():
  class Counter(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.register_buffer("calls", torch.zeros([], dtype=torch.int64))

    def forward(self, x):
      self.calls = self.calls + 1
      return x

  net = Counter()
  own = net.calls
  passed = torch.tensor(5)
  _, reassigned = _swap.TensorSlots(net, ["calls"]).call({"calls": passed}, (torch.ones(1),), {})
  assert list(reassigned) == ["calls"] and int(reassigned["calls"]) == 6
  assert net.calls is own and int(passed) == 5
