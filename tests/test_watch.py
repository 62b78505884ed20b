"""The stale-state watch (`_capture._watch.Snapshot`): every kind of change it
documents is seen by its check in C (`_unchanged`) and named by
`first_change`, and nothing else is."""

import math

import pytest
import torch

from torchbridge._capture import _watch


class Net(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(2, 2)
    self.scale = 1
    self.ratio = 0.5
    self.flag = True
    self.name = "net"
    self.sizes = [1, 2]
    self.table = {"a": (1, 2)}
    self.nan = math.nan
    self.offset = torch.zeros(2)  # a plain tensor attribute (no buffer)


def _snapshot(net):
  return _watch.Snapshot(list(net.named_modules()))


def _changed(net, change):
  snap = _snapshot(net)
  assert snap._unchanged() and snap.first_change() is None
  change(net)
  return snap._unchanged(), snap.first_change()


@pytest.mark.parametrize(
  "change, named",
  [
    (lambda n: setattr(n, "scale", 2), "scale: 1 when captured, 2 now"),
    (
      lambda n: setattr(n, "scale", 1.0),
      "scale: 1 when captured, 1.0 now",
    ),  # equal, not the same type
    (lambda n: setattr(n, "flag", 1), "flag: True when captured, 1 now"),
    (lambda n: setattr(n, "ratio", 0.25), "ratio: 0.5 when captured, 0.25 now"),
    (lambda n: setattr(n, "name", "other"), "name: 'net' when captured, 'other' now"),
    (lambda n: n.sizes.append(3), "sizes: [1, 2] when captured, [1, 2, 3] now"),
    (lambda n: n.table.update(b=1), "table: {'a': (1, 2)} when captured"),
    (lambda n: setattr(n, "nan", float("nan")), "nan: nan when captured, nan now"),  # another NaN
    (lambda n: delattr(n, "ratio"), "ratio: 0.5 when captured, deleted now"),
    (lambda n: n.offset.add_(1.0), "offset (a tensor attribute, replaced or written in place)"),
    (lambda n: setattr(n, "offset", torch.zeros(2)), "offset (a tensor attribute"),
    (lambda n: setattr(n.lin, "in_features", 3), "lin.in_features: 2 when captured, 3 now"),
    (lambda n: setattr(n, "lin", torch.nn.Linear(2, 2)), "_modules (its submodules changed)"),
    (lambda n: n.lin.register_forward_hook(lambda *a: None), "lin._forward_hooks (its hooks"),
    (
      lambda n: n.register_forward_pre_hook(lambda *a: None),
      "_forward_pre_hooks (its hooks changed)",
    ),
  ],
)
def test_each_change_is_seen_and_named(change, named):
  unchanged, message = _changed(Net(), change)
  assert not unchanged
  assert message is not None and named in message


@pytest.mark.parametrize(
  "same",
  [
    lambda n: setattr(n, "scale", 1),  # the same value again
    lambda n: setattr(n, "sizes", [1, 2]),  # an equal list, another object
    lambda n: setattr(n, "table", {"a": (1, 2)}),
    lambda n: setattr(n, "unwatched", object()),  # a new attribute: not read when captured
    lambda n: n.lin.weight.data.add_(1.0),  # parameters are the variables' (not watched)
    lambda n: n.train(False),  # modes: part of the key, held by `Modes` instead
  ],
)
def test_what_is_not_a_change(same):
  unchanged, message = _changed(Net(), same)
  assert unchanged and message is None


def test_same_nan_object_is_no_change():
  net = Net()
  snap = _snapshot(net)
  net.nan = snap._entries[[e[0] for e in snap._entries].index("nan")][3]  # the captured object
  assert snap._unchanged() and snap.first_change() is None


def test_ignored_hooks_are_not_changes_but_others_are():
  net = Net()
  ours = lambda *a: None  # noqa: E731
  net.lin.register_forward_hook(ours)
  snap = _watch.Snapshot(list(net.named_modules()), ignored=frozenset({id(ours)}))
  handle = next(iter(net.lin._forward_hooks))
  del net.lin._forward_hooks[handle]  # torchbridge's own hook taken out (suspended)
  assert not snap._unchanged()  # the check in C looks again ...
  assert snap.first_change() is None  # ... and finds no change of the user's
  net.lin.register_forward_hook(lambda *a: None)
  assert "lin._forward_hooks" in snap.first_change()


class _Hook:
  """A hook whose == cannot answer (as an array-like object's)."""

  def __call__(self, *args):
    return None

  def __eq__(self, other):
    raise ValueError("ambiguous")

  __hash__ = object.__hash__


def test_a_hook_whose_equality_raises_is_compared_by_identity():
  net = Net()
  net.lin.register_forward_hook(_Hook())
  snap = _snapshot(net)
  assert snap._unchanged() and snap.first_change() is None  # the same object: no == asked
  (key,) = net.lin._forward_hooks
  net.lin._forward_hooks[key] = _Hook()  # another hook under the same key: == raises
  assert not snap._unchanged()
  assert "lin._forward_hooks (its hooks changed)" in snap.first_change()


# ------------------------------------------ the modes a training=None graph took


def test_modes_name_the_switch_in_both_directions():
  net = Net().train()
  modes = _watch.Modes(list(net.named_modules()))
  assert modes.first_change() is None
  net.eval()
  assert modes.first_change() == "training was True when traced, False now"
  net.train()
  assert modes.first_change() is None  # back as traced: runs again
  evaluated = Net().eval()
  modes = _watch.Modes(list(evaluated.named_modules()))
  evaluated.train()
  assert modes.first_change() == "training was False when traced, True now"


def test_modes_name_the_submodules_when_only_some_flip():
  net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5), torch.nn.BatchNorm1d(2))
  modes = _watch.Modes(list(net.named_modules()))
  net[1].eval()
  assert modes.first_change() == "training was True when traced, False now (submodule '1')"
  net[2].eval()
  assert modes.first_change() == (
    "training was True when traced, False now (submodule '1', submodule '2')"
  )
  net[1].train()
  net[2].train()
  net.training = False  # the container alone
  assert modes.first_change() == ("training was True when traced, False now (the module itself)")
