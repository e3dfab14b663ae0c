"""User errors raise PyTorch's exception type with PyTorch's message (architecture page, "Errors").

Each case runs the same mistake in torch (to get its exception and message at test time) and in kiln;
kiln must raise the same type with a message containing torch's (``torch.`` read as ``kiln.``)."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln
from kiln import _plugins


def case(fn):
    """A (kiln_fn, torch_fn) pair from ``fn(lib)``."""
    return (lambda: fn(kiln)), (lambda: fn(torch))


ERRORS = {
    # broadcasting
    "broadcast mismatch": lambda L: L.ones(2, 3) + L.ones(2, 4),
    "broadcast mismatch different ranks": lambda L: L.ones(3) * L.ones(2, 4),
    "broadcast mismatch leading dim": lambda L: L.ones(2, 1, 3) - L.ones(5, 4, 1),
    "where broadcast mismatch": lambda L: L.where(L.ones(3, dtype=L.bool), L.ones(2), 0.0),
    "expand mismatch": lambda L: L.ones(3, 2).expand(3, 4),
    "expand too few sizes": lambda L: L.ones(3, 1).expand(4),
    "broadcast_shapes mismatch": lambda L: L.broadcast_shapes((2, 3), (4, 3)),
    "broadcast_shapes lists": lambda L: L.broadcast_shapes([2, 3], [4, 3]),
    "broadcast_shapes ints": lambda L: L.broadcast_shapes(3, 4),
    "broadcast_shapes longer later": lambda L: L.broadcast_shapes((1, 2), (3, 1, 3)),
    "broadcast_shapes third": lambda L: L.broadcast_shapes((5, 1), (1, 2), (3, 2)),
    "broadcast_shapes negative": lambda L: L.broadcast_shapes((2, -1)),
    # matmul
    "mm shapes": lambda L: L.ones(2, 3) @ L.ones(4, 5),
    "mm function shapes": lambda L: L.mm(L.ones(2, 3), L.ones(4, 5)),
    "dot sizes": lambda L: L.ones(3) @ L.ones(4),
    "mv sizes": lambda L: L.ones(2, 3) @ L.ones(4),
    "vm sizes": lambda L: L.ones(3) @ L.ones(4, 5),
    "bmm sizes": lambda L: L.ones(2, 2, 3) @ L.ones(2, 4, 5),
    "matmul 0-d": lambda L: L.ones(()) @ L.ones(3),
    "matmul batch broadcast": lambda L: L.ones(2, 2, 3) @ L.ones(3, 3, 4),
    "matmul dtype mismatch": lambda L: L.ones(2, 2) @ L.ones(2, 2, dtype=L.float64),
    # views and shapes
    "invalid view": lambda L: L.ones(2, 3).t().view(-1),
    "view size": lambda L: L.ones(6).view(4),
    "view size with -1": lambda L: L.ones(6).view(-1, 4),
    "reshape size": lambda L: L.ones(2, 3).reshape(4, 2),
    "two -1": lambda L: L.ones(6).view(-1, -1),
    "negative size in view": lambda L: L.ones(6).view(-2, 3),
    "permute wrong length": lambda L: L.ones(2, 3).permute(0),
    "permute duplicate dims": lambda L: L.ones(2, 3).permute(0, 0),
    "flatten start after end": lambda L: L.ones(2, 3, 4).flatten(2, 1),
    "narrow out of range": lambda L: L.ones(4).narrow(0, 2, 3),
    "t on 3-d": lambda L: L.ones(2, 3, 4).t(),
    "mT on 1-d": lambda L: L.ones(3).mT,
    # indexing
    "index out of range": lambda L: L.ones(3)[5],
    "negative index out of range": lambda L: L.ones(3)[-4],
    "index out of range dim 1": lambda L: L.ones(2, 3)[0, 5],
    "too many indices": lambda L: L.ones(3)[0, 0],
    "select out of range": lambda L: L.ones(3).select(0, 5),
    "index 0-d tensor": lambda L: L.ones(())[0],
    "item of many": lambda L: L.ones(2).item(),
    # dims
    "sum dim out of range": lambda L: L.ones(2, 3).sum(2),
    "sum negative dim out of range": lambda L: L.ones(2, 3).sum(-3),
    "sum dim on 0-d": lambda L: L.ones(()).sum(1),
    "mean dim out of range": lambda L: L.ones(2, 3).mean(5),
    "max dim out of range": lambda L: L.ones(2, 3).max(2),
    "argmax dim out of range": lambda L: L.ones(2, 3).argmax(-3),
    "amax dim out of range": lambda L: L.ones(2, 3).amax(3),
    "any dim out of range": lambda L: L.ones(2, 3).any(4),
    "squeeze dim out of range": lambda L: L.ones(2, 3).squeeze(2),
    "unsqueeze dim out of range": lambda L: L.ones(2, 3).unsqueeze(4),
    "transpose dim out of range": lambda L: L.ones(2, 3).transpose(0, 2),
    "select dim out of range": lambda L: L.ones(2, 3).select(2, 0),
    "size dim out of range": lambda L: L.ones(2, 3).size(2),
    "stride dim out of range": lambda L: L.ones(2, 3).stride(-3),
    "flatten dim out of range": lambda L: L.ones(2, 3).flatten(0, 2),
    "duplicate reduction dims": lambda L: L.ones(2, 3).sum((0, 0)),
    # reductions
    "mean of int": lambda L: L.tensor([1, 2]).mean(),
    "max of empty": lambda L: L.ones(0).max(),
    "argmax of empty": lambda L: L.ones(0).argmax(),
    "amax over empty dim": lambda L: L.ones(0, 3).amax(0),
    "max dim over empty dim": lambda L: L.ones(0, 3).max(0),
    # dtypes
    "inplace float into long": lambda L: L.tensor([1, 2]).add_(1.5),
    "inplace div of long": lambda L: L.tensor([1, 2]).div_(2),
    "inplace float tensor into int": lambda L: L.tensor([1, 2], dtype=L.int32).mul_(L.tensor([1.5, 2.0])),
    "inplace into bool": lambda L: L.tensor([True]).add_(2),
    "inplace broadcast shape": lambda L: L.ones(3, 1).add_(L.ones(1, 4)),
    "sub of bools": lambda L: L.tensor([True]) - L.tensor([False]),
    "neg of bool": lambda L: -L.tensor([True]),
    "bitwise on float": lambda L: L.ones(2) & L.ones(2),
    "invert float": lambda L: ~L.ones(2),
    "int to negative power": lambda L: L.tensor([2]) ** -1,
    "bad rounding mode": lambda L: L.div(L.ones(2), L.ones(2), rounding_mode="round"),
    "where with float condition": lambda L: L.where(L.ones(2), L.ones(2), L.zeros(2)),
    "set_default_dtype int": lambda L: L.set_default_dtype(L.int64),
    # autograd
    "backward without grad": lambda L: L.ones(2).sum().backward(),
    "backward of non-scalar": lambda L: (L.ones(2, requires_grad=True) * 2).backward(),
    "backward of int output": lambda L: L.ones(2, requires_grad=True).argmax().backward(),
    "backward grad shape mismatch": lambda L: (L.ones(3, requires_grad=True) * 2).backward(L.ones(2)),
    "requires_grad on int tensor": lambda L: L.tensor([1, 2], requires_grad=True),
    "requires_grad on int zeros": lambda L: L.zeros(2, dtype=L.int64, requires_grad=True),
    "requires_grad_ on int": lambda L: L.tensor([1, 2]).requires_grad_(),
    "requires_grad_(False) on non-leaf": lambda L: (L.ones(2, requires_grad=True) * 2).requires_grad_(False),
    "grad of tensor not requiring grad": lambda L: L.autograd.grad(L.ones(2, requires_grad=True).sum(), L.ones(2)),
    "leaf inplace": lambda L: L.ones(2, requires_grad=True).mul_(2),
    "numpy of requires_grad": lambda L: L.ones(2, requires_grad=True).numpy(),
    "bool of many": lambda L: bool(L.ones(2)),
    "bool of empty": lambda L: bool(L.ones(0)),
    "len of 0-d": lambda L: len(L.ones(())),
    "iter of 0-d": lambda L: iter(L.ones(())),
    # creation
    "arange zero step": lambda L: L.arange(0, 3, 0),
    "arange wrong sign": lambda L: L.arange(0, 3, -1),
    "randint low >= high": lambda L: L.randint(3, 3, (2,)),
    "negative dimension": lambda L: L.zeros(-1),
    "ragged list": lambda L: L.tensor([[1, 2], [3]]),
    "linspace negative steps": lambda L: L.linspace(0, 1, -2),
    "from_numpy negative strides": lambda L: L.from_numpy(np.arange(4.0)[::-1]),
    "from_numpy not an array": lambda L: L.from_numpy([1, 2]),
    # device strings
    "device bad index": lambda L: L.device("cuda:x"),
    "device empty string": lambda L: L.device(""),
    "device negative index": lambda L: L.device("cuda:-1"),
    "device two colons": lambda L: L.device("cuda:1:2"),
    "device space": lambda L: L.device("cuda: 1"),
    "device index twice": lambda L: L.device("cuda:1", 1),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_error_type_and_message(name):
    kfn, tfn = case(ERRORS[name])
    U.assert_same_error(kfn, tfn)


@pytest.mark.parametrize(
    "name,expected",
    [
        (
            "broadcast mismatch",
            "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1",
        ),
        ("mm shapes", "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"),
        ("invalid view", "view size is not compatible with input tensor's size and stride"),
        ("view size", "shape '[4]' is invalid for input of size 6"),
        ("sum dim out of range", "Dimension out of range (expected to be in range of [-2, 1], but got 2)"),
        ("backward without grad", "element 0 of tensors does not require grad and does not have a grad_fn"),
        ("backward of non-scalar", "grad can be implicitly created only for scalar outputs"),
        ("inplace float into long", "result type Float can't be cast to the desired output type Long"),
        ("leaf inplace", "a leaf Variable that requires grad is being used in an in-place operation."),
    ],
)
def test_documented_messages(name, expected):
    """The messages the docs and users rely on, spelled out (so a change in torch cannot hide a kiln bug)."""
    kfn, tfn = case(ERRORS[name])
    exc = U.torch_error(tfn)
    assert expected in str(exc), f"torch's wording changed: {exc}"
    with pytest.raises(type(exc)) as info:
        kfn()
    assert expected in str(info.value)


# ---------------------------------------------------------------------------------------- devices


def test_device_parsing_valid():
    for s in ("cpu", "cuda", "cuda:0", "cuda:1", "cpu:0"):
        k, t = kiln.device(s), torch.device(s)
        assert (k.type, k.index) == (t.type, t.index)
        assert str(k) == str(t)
        assert repr(k) == repr(t)
    assert kiln.device("cuda", 1) == kiln.device("cuda:1")
    assert kiln.device(kiln.device("cpu")) == kiln.device("cpu")


def test_unregistered_device_type_errors():
    """Placing a tensor on a device type no plugin registers raises RuntimeError naming the type."""
    for fn in (
        lambda: kiln.zeros(2, device="nosuchdev"),
        lambda: kiln.ones(2).to("nosuchdev"),
        lambda: kiln.tensor([1.0], device="nosuchdev:1"),
        lambda: kiln.empty(3, device=kiln.device("nosuchdev")),
    ):
        with pytest.raises(RuntimeError, match="Device type 'nosuchdev' is not registered"):
            fn()


class _FakeDevicePlugin:
    """A test-only device type ``kilntestdev`` backed by host NumPy buffers."""

    @staticmethod
    def kiln_register_devices(register):
        register(
            "kilntestdev",
            empty=lambda n, dtype, index=None: np.empty(n, dtype.numpy),
            to_host=lambda s: s,
            from_host=lambda a, index=None: np.array(a, copy=True).reshape(-1),
            write=lambda s, start, a: s.__setitem__(slice(start, start + a.size), a),
        )


@pytest.fixture
def fake_device():
    name = "kiln_tests_fake_device"
    _plugins.register_plugin(_FakeDevicePlugin(), name)
    try:
        yield "kilntestdev"
    finally:
        _plugins.unregister_plugin(name)


def test_device_mismatch_error(fake_device):
    """Mixing devices in one op is an error (architecture page, "The core model" and "Errors"), never a silent copy."""
    a = kiln.ones(3, device=fake_device)
    b = kiln.ones(3)
    assert str(a.device) == f"{fake_device}:0"
    for fn, first, second in (
        (lambda: a + b, a.device, b.device),
        (lambda: b * a, b.device, a.device),
        (lambda: b @ a, b.device, a.device),
        (lambda: kiln.where(b > 0, b, a), b.device, a.device),
    ):
        with pytest.raises(RuntimeError) as info:
            fn()
        assert str(info.value) == (
            f"Expected all tensors to be on the same device, but found at least two devices, {first} and {second}!"
        )
    # a 0-d CPU tensor mixes with any device, as in torch (only the error path is under test here)
    try:
        a + kiln.tensor(2.0)
    except RuntimeError as exc:
        assert "same device" not in str(exc)
    except NotImplementedError:
        pass  # the fake device has no add kernel: not a device-mismatch error
    moved = b.to(fake_device)
    assert moved.device == a.device
    assert moved.cpu().tolist() == [1.0, 1.0, 1.0]
