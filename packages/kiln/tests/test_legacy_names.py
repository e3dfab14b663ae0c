"""PyTorch names for unchanged programs: the legacy tensor types (``kiln.FloatTensor``...), ``size=`` of the
creation functions, ``multinomial``, ``equal`` and ``Tensor.__format__``, compared with PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

NAMES = [
    "FloatTensor",
    "DoubleTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "LongTensor",
    "IntTensor",
    "ShortTensor",
    "CharTensor",
    "ByteTensor",
    "BoolTensor",
]


def _dtype_name(d) -> str:
    return str(d).split(".")[-1]


def _same(k, t):
    assert tuple(k.shape) == tuple(t.shape)
    assert _dtype_name(k.dtype) == _dtype_name(t.dtype)


def _values(k, t):
    _same(k, t)
    np.testing.assert_array_equal(k.to(kiln.float64).numpy(), t.to(torch.float64).numpy())


def _error(fn_k, fn_t):
    with pytest.raises(Exception) as et:
        fn_t()
    with pytest.raises(type(et.value)) as ek:
        fn_k()
    assert str(ek.value) == str(et.value).replace("torch", "kiln")


# ---------------------------------------------------------------------------------------- legacy types


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "data", [[1, 0, 2], [[1.5, 2.0], [0.0, 3.0]], (1, 2), [True, False], [], np.array([1, 0, 3]), np.array(2.0)]
)
def test_legacy_constructor_from_data(name, data):
    _values(getattr(kiln, name)(data), getattr(torch, name)(data))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("args", [(), (2, 3), (0,), (4,)])
def test_legacy_constructor_from_sizes(name, args):
    _same(getattr(kiln, name)(*args), getattr(torch, name)(*args))
    _same(getattr(kiln, name)(kiln.Size(args)), getattr(torch, name)(torch.Size(args)))
    _same(getattr(kiln, name)(size=args), getattr(torch, name)(size=args))
    _same(getattr(kiln, name)(*args, device="cpu"), getattr(torch, name)(*args, device="cpu"))


def test_legacy_constructor_from_tensor_shares_storage():
    a = kiln.zeros(3, requires_grad=True)
    b = kiln.FloatTensor(a)
    assert b is not a and b.requires_grad and b.shape == (3,)
    with kiln.no_grad():
        b[0] = 5.0
    assert a[0].item() == 5.0
    assert kiln.FloatTensor(kiln.tensor(3.0)).shape == ()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("other", ["float64", "int64", "bool", "float16"])
def test_legacy_constructor_from_tensor_of_other_dtype(name, other):
    kt, tt = getattr(kiln, name), getattr(torch, name)
    if tt.dtype == getattr(torch, other):
        _same(kt(kiln.zeros(2, dtype=getattr(kiln, other))), tt(torch.zeros(2, dtype=getattr(torch, other))))
    else:
        _error(
            lambda: kt(kiln.zeros(2, dtype=getattr(kiln, other))),
            lambda: tt(torch.zeros(2, dtype=getattr(torch, other))),
        )


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((2.5,), {}),
        ((True,), {}),
        ((np.float64(2),), {}),
        (("a",), {}),
        ((-1,), {}),
        ((2, 3, 4.0), {}),
        (([[1], [2, 3]],), {}),
    ],
)
def test_legacy_constructor_errors(args, kwargs):
    targs = tuple(torch.zeros(2) if isinstance(a, kiln.Tensor) else a for a in args)
    _error(lambda: kiln.FloatTensor(*args, **kwargs), lambda: torch.FloatTensor(*targs, **kwargs))


def test_legacy_constructor_error_forms():
    _error(
        lambda: kiln.FloatTensor(kiln.zeros(2), device="cpu"), lambda: torch.FloatTensor(torch.zeros(2), device="cpu")
    )
    for bad in ({"dtype": kiln.float32}, {"requires_grad": True}):
        with pytest.raises(TypeError, match=r"^new\(\) received an invalid combination of arguments - got \(int, "):
            kiln.FloatTensor(2, **bad)
    with pytest.raises(TypeError, match=r"^new\(\) received an invalid combination of arguments - got \(list, list\)"):
        kiln.FloatTensor([1], [2])


@pytest.mark.parametrize("name", NAMES)
def test_legacy_type_isinstance_and_attributes(name):
    kt, tt = getattr(kiln, name), getattr(torch, name)
    assert _dtype_name(kt.dtype) == _dtype_name(tt.dtype)
    assert kt.__name__ == name and repr(kt) == f"<class 'kiln.{name}'>"
    assert kt.is_cuda is False
    assert issubclass(kt, kiln.Tensor) is issubclass(tt, torch.Tensor)
    for other in NAMES:
        k_inst = isinstance(kiln.zeros(2, dtype=getattr(kiln, other).dtype), kt)
        t_inst = isinstance(torch.zeros(2, dtype=getattr(torch, other).dtype), tt)
        assert k_inst == t_inst
    assert not isinstance(3, kt) and not isinstance([1], kt)
    assert type(kt([1])) is kiln.Tensor
    assert isinstance(kt([1]), kiln.Tensor)


@pytest.mark.parametrize("name", NAMES)
def test_type_names_and_conversions(name):
    dtype_k, dtype_t = getattr(kiln, name).dtype, getattr(torch, name).dtype
    x = kiln.zeros(2, dtype=dtype_k)
    assert x.type() == f"kiln.{name}" == torch.zeros(2, dtype=dtype_t).type().replace("torch", "kiln")
    src_k, src_t = kiln.tensor([1.5, -2.0]), torch.tensor([1.5, -2.0])
    for arg_k, arg_t in (
        (getattr(kiln, name), getattr(torch, name)),
        (f"kiln.{name}", f"torch.{name}"),
        (dtype_k, dtype_t),
    ):
        _values(src_k.type(arg_k), src_t.type(arg_t))
    _values(src_k.type(dtype=getattr(kiln, name)), src_t.type(dtype=getattr(torch, name)))
    assert src_k.type(f"torch.{name}").dtype is dtype_k  # PyTorch spellings of the name work too
    if dtype_k is kiln.float32:
        assert src_k.type(kiln.FloatTensor) is src_k


@pytest.mark.parametrize("bad", ["foo", "int64", "kiln.int64", "kiln.NoTensor"])
def test_type_rejects_unknown_names(bad):
    _error(lambda: kiln.zeros(2).type(bad), lambda: torch.zeros(2).type(bad.replace("kiln", "torch")))


# ---------------------------------------------------------------------------------------- size=


@pytest.mark.parametrize("name", ["zeros", "ones", "empty", "rand", "randn"])
@pytest.mark.parametrize("size", [(2, 3), [4], (), "Size"])
def test_size_keyword(name, size):
    ks = kiln.Size((2, 1)) if size == "Size" else size
    ts = torch.Size((2, 1)) if size == "Size" else size
    _same(getattr(kiln, name)(size=ks), getattr(torch, name)(size=ts))
    _same(getattr(kiln, name)(size=ks, dtype=kiln.float64), getattr(torch, name)(size=ts, dtype=torch.float64))


@pytest.mark.parametrize("name", ["zeros", "ones", "empty", "rand", "randn"])
def test_size_keyword_errors(name):
    _error(lambda: getattr(kiln, name)(size=2), lambda: getattr(torch, name)(size=2))
    if name in ("rand", "randn"):  # PyTorch lists its overloads here; kiln says what is wrong
        with pytest.raises(TypeError, match="multiple values for argument 'size'"):
            getattr(kiln, name)(2, size=(2,))
    else:
        _error(lambda: getattr(kiln, name)(2, size=(2,)), lambda: getattr(torch, name)(2, size=(2,)))
    _error(lambda: getattr(kiln, name)(size=(-1,)), lambda: getattr(torch, name)(size=(-1,)))


def test_size_keyword_full_and_randint():
    _values(kiln.full(size=(2, 3), fill_value=1.5), torch.full(size=(2, 3), fill_value=1.5))
    for kw in ({"low": 0, "high": 5}, {"high": 5}):
        k, t = kiln.randint(size=(2, 3), **kw), torch.randint(size=(2, 3), **kw)
        _same(k, t)
        assert k.min().item() >= 0 and k.max().item() < 5
    _same(kiln.randint(0, 5, size=(2, 3)), torch.randint(0, 5, size=(2, 3)))
    _same(kiln.randint(5, size=(4,)), torch.randint(5, size=(4,)))
    _same(kiln.randint(3, high=5, size=(4,)), torch.randint(3, high=5, size=(4,)))
    g = kiln.Generator().manual_seed(1)
    _same(kiln.rand(size=(2,), generator=g), torch.rand(size=(2,), generator=torch.Generator()))


# ---------------------------------------------------------------------------------------- multinomial

P = [0.2, 0.3, 0.5]


@pytest.mark.parametrize(
    "data, kwargs",
    [
        (P, {"num_samples": 4}),
        (P, {"num_samples": 0}),
        (P, {"num_samples": -1}),
        (P, {"num_samples": 0, "replacement": True}),
        ([-1.0, 1.0], {"num_samples": 1}),
        ([float("inf"), 1.0], {"num_samples": 1}),
        ([float("nan"), 1.0], {"num_samples": 1, "replacement": True}),
        ([0.0, 0.0], {"num_samples": 1}),
        ([[0.0, 0.0], [1.0, 1.0]], {"num_samples": 1}),
        ([[1.0, 1.0], [-1.0, 1.0]], {"num_samples": 1}),
        ([[[1.0]]], {"num_samples": 1}),
        (1.0, {"num_samples": 1}),
        ([1, 2], {"num_samples": 1}),
        ([True, False], {"num_samples": 1}),
        ([], {"num_samples": 1}),
        ([-1.0, 1.0], {"num_samples": 5}),
        (P, {"num_samples": 2.0}),
        (P, {"num_samples": True}),
    ],
)
def test_multinomial_errors(data, kwargs):
    kwargs = dict(kwargs)
    n = kwargs.pop("num_samples")
    _error(
        lambda: kiln.multinomial(kiln.tensor(data), n, **kwargs),
        lambda: torch.multinomial(torch.tensor(data), n, **kwargs),
    )


def test_multinomial_input_type_error():
    _error(lambda: kiln.multinomial([0.5], 1), lambda: torch.multinomial([0.5], 1))


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("shape, n", [((3,), 2), ((3,), 3), ((4, 5), 3), ((0, 3), 2), ((2, 3), 1)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_multinomial_shapes_and_dtypes(replacement, shape, n, dtype):
    k = kiln.multinomial(kiln.ones(shape, dtype=getattr(kiln, dtype)), n, replacement)
    t = torch.multinomial(torch.ones(shape, dtype=getattr(torch, dtype)), n, replacement)
    _same(k, t)
    m = kiln.ones(shape, dtype=getattr(kiln, dtype)).multinomial(num_samples=n, replacement=replacement)
    _same(m, t)


def test_multinomial_without_replacement_is_distinct():
    kiln.manual_seed(0)
    for _ in range(50):
        rows = kiln.multinomial(kiln.rand(4, 10) + 0.01, 10).tolist()
        assert all(sorted(r) == list(range(10)) for r in rows)
    # zero-weight categories come last, as PyTorch's
    out = kiln.multinomial(kiln.tensor([0.0, 1.0, 0.0]), 2).tolist()
    assert out == torch.multinomial(torch.tensor([0.0, 1.0, 0.0]), 2).tolist() == [1, 0]
    assert kiln.multinomial(kiln.tensor([0.0, 1.0, 0.0]), 2, True).tolist() == [1, 1]


@pytest.mark.parametrize("replacement", [True, False])
def test_multinomial_frequencies(replacement):
    probs = [0.1, 0.0, 0.2, 0.3, 0.4]
    g = kiln.Generator().manual_seed(1234)
    if replacement:
        draws = kiln.multinomial(kiln.tensor(probs), 40000, True, generator=g).tolist()
    else:  # the first draw of each row follows the probabilities
        draws = kiln.multinomial(kiln.tensor([probs] * 40000), 1, generator=g).reshape(-1).tolist()
    freq = np.bincount(draws, minlength=5) / len(draws)
    np.testing.assert_allclose(freq, probs, atol=0.01)
    assert freq[1] == 0


def test_multinomial_unnormalised_rows_and_without_replacement_pairs():
    g = kiln.Generator().manual_seed(7)
    weights = kiln.tensor([[1.0, 3.0], [6.0, 2.0]])
    out = kiln.multinomial(weights, 20000, True, generator=g)
    np.testing.assert_allclose(out.to(kiln.float64).mean(dim=1).tolist(), [0.75, 0.25], atol=0.015)
    # second draw without replacement: P(first=0, second=1) for weights [1, 3]: 1/4
    pairs = kiln.multinomial(kiln.tensor([[1.0, 3.0, 0.0]] * 20000), 2, generator=g).tolist()
    assert all(p[0] != p[1] for p in pairs)
    share = sum(p == [0, 1] for p in pairs) / len(pairs)
    assert abs(share - 0.25) < 0.015


def test_multinomial_generator_reproducibility():
    p = kiln.tensor([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])
    a = kiln.multinomial(p, 3, generator=kiln.Generator().manual_seed(3))
    b = kiln.multinomial(p, 3, generator=kiln.Generator().manual_seed(3))
    assert a.tolist() == b.tolist()
    kiln.manual_seed(11)
    c = p.multinomial(5, replacement=True)
    kiln.manual_seed(11)
    d = kiln.multinomial(p, 5, replacement=True)
    assert c.tolist() == d.tolist() and c.dtype is kiln.int64


def test_multinomial_requires_grad_input():
    out = kiln.multinomial(kiln.ones(3, requires_grad=True), 2)
    assert not out.requires_grad and out.dtype is kiln.int64


# ---------------------------------------------------------------------------------------- equal

EQUAL_CASES = [
    ([1, 2], "int64", [1, 2], "int64"),
    ([1, 2], "int64", [1.0, 2.0], "float32"),
    ([1, 2], "int64", [1, 3], "int64"),
    ([1, 2], "int64", [[1, 2]], "int64"),
    ([1, 2], "int64", [True, True], "bool"),
    ([float("nan")], "float32", [float("nan")], "float32"),
    ([0.0], "float32", [-0.0], "float32"),
    ([1], "int64", 1, "int64"),
    ([1.5], "float32", [1], "int64"),
    ([1.0], "float16", [1.0], "float32"),
    ([0.1], "float64", [0.1], "float32"),
    ([257], "int64", [1], "uint8"),
    ([2.0], "float32", [True], "bool"),
    ([], "float32", [], "float32"),
]


@pytest.mark.parametrize("a, da, b, db", EQUAL_CASES)
def test_equal(a, da, b, db):
    ka, kb = kiln.tensor(a, dtype=getattr(kiln, da)), kiln.tensor(b, dtype=getattr(kiln, db))
    ta, tb = torch.tensor(a, dtype=getattr(torch, da)), torch.tensor(b, dtype=getattr(torch, db))
    expected = torch.equal(ta, tb)
    assert kiln.equal(ka, kb) is expected
    assert ka.equal(kb) is expected


def test_equal_shapes_grad_and_errors():
    assert kiln.equal(kiln.zeros(0), kiln.zeros(0, 1)) is torch.equal(torch.zeros(0), torch.zeros(0, 1))
    assert kiln.equal(kiln.ones(2, requires_grad=True), kiln.ones(2)) is True
    assert kiln.equal(kiln.tensor([1, 2]), kiln.tensor([1, 2]).expand(2, 2)) is False
    assert kiln.equal(input=kiln.ones(1), other=kiln.ones(1)) is True
    _error(lambda: kiln.equal(kiln.ones(1), 1.0), lambda: torch.equal(torch.ones(1), 1.0))
    _error(lambda: kiln.equal([1], kiln.ones(1)), lambda: torch.equal([1], torch.ones(1)))


# ---------------------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    "value, dtype, spec",
    [
        (3.14159, "float32", ".2f"),
        (3.5, "float32", ""),
        (2.5, "float32", ">8"),
        (1e10, "float32", "e"),
        (3, "int64", "d"),
        (3, "int64", ".2f"),
        (True, "bool", ""),
        (True, "bool", "d"),
        (3.5, "float16", ""),
        ([3.14159], "float32", ".2f"),
        ([[3.14159]], "float32", ".2f"),
        ([1.0, 2.0], "float32", ".2f"),
        ([3.5], "float32", ">10"),
        ([], "float32", ".2f"),
        (3.5, "float32", "d"),
    ],
)
def test_format(value, dtype, spec):
    k, t = kiln.tensor(value, dtype=getattr(kiln, dtype)), torch.tensor(value, dtype=getattr(torch, dtype))
    try:
        expected = format(t, spec)
    except (TypeError, ValueError):
        _error(lambda: format(k, spec), lambda: format(t, spec))
    else:
        assert format(k, spec) == expected


def test_format_empty_spec_of_larger_tensors_is_str():
    for k in (kiln.tensor([1.0, 2.0]), kiln.tensor([3.5], requires_grad=True), kiln.zeros(0)):
        assert format(k, "") == str(k)
    assert f"{kiln.tensor(3.5, requires_grad=True):.1f}" == "3.5"
