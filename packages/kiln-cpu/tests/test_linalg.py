"""addmm and baddbmm against the reference kernels: bias shapes that broadcast, alpha and beta (beta = 0
ignores NaN in the input), transposed and strided operands, and the cases left to the reference; the BLAS
thread count every product runs on (one thread for small products, restored afterwards, also under
concurrent callers), and products with a BLAS whose count cannot be set."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from kiln_cpu_helpers import assert_product_within_bound, assert_same, reference

import kiln
from kiln import _plugins
from kiln_cpu import _blas, _threads, config

FLOAT = [kiln.float32, kiln.float64]


@pytest.fixture(autouse=True)
def numpys_blas(monkeypatch):
    """These tests are about NumPy's OpenBLAS (bit for bit the reference's products, its thread count):
    MKL, where the ``mkl`` wheel is installed, is tested in test_mkl.py."""
    monkeypatch.setattr(config, "blas", "openblas")


def _rand(shape, dtype, seed):
    return kiln.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(dtype.numpy))


SCALES = [(1, 1), (0.5, 2.0), (0, 1), (2, -1), (1, 0)]


@pytest.mark.parametrize("beta,alpha", SCALES)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_addmm_matches_reference(dtype, beta, alpha):
    a, b = _rand((9, 13), dtype, 0), _rand((13, 7), dtype, 1)
    wide = _rand((13, 14), dtype, 5)
    nan_bias = _rand((7,), dtype, 6)
    nan_bias[2] = float("nan")
    for base in (_rand((7,), dtype, 2), _rand((9, 7), dtype, 3), _rand((9, 1), dtype, 4), nan_bias):
        for x, y in ((a, b), (a.t().contiguous().t(), b), (a, wide[:, ::2])):  # dense, transposed, strided
            fn = lambda s, p, q: kiln.addmm(s, p, q, beta=beta, alpha=alpha)
            assert_same(fn(base, x, y), reference(fn, base, x, y), ulps=4, atol=1e-12)
    assert _plugins.kernel_owner("addmm", "cpu", dtype) == "cpu"


@pytest.mark.parametrize("beta,alpha", SCALES)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_baddbmm_matches_reference(dtype, beta, alpha):
    a, b = _rand((3, 5, 6), dtype, 0), _rand((3, 6, 4), dtype, 1)
    bt = _rand((3, 4, 6), dtype, 7).transpose(1, 2)
    for base in (_rand((4,), dtype, 2), _rand((3, 5, 4), dtype, 3), _rand((1, 5, 1), dtype, 4)):
        for y in (b, bt):
            fn = lambda s, p, q: kiln.baddbmm(s, p, q, beta=beta, alpha=alpha)
            assert_same(fn(base, a, y), reference(fn, base, a, y), ulps=4, atol=1e-12)


def test_numpy_scalars_and_other_dtypes_go_to_the_reference():
    a, b, c = _rand((4, 5), kiln.float32, 0), _rand((5, 3), kiln.float32, 1), _rand((3,), kiln.float32, 2)
    fn = lambda s, p, q: kiln.addmm(s, p, q, alpha=np.float64(0.1), beta=np.float64(0.3))
    assert_same(fn(c, a, b), reference(fn, c, a, b))
    h = [t.to(kiln.float16) for t in (c, a, b)]
    assert_same(kiln.addmm(*h), reference(kiln.addmm, *h))
    assert _plugins.kernel_owner("addmm", "cpu", kiln.float16) == _plugins.REFERENCE_PLUGIN


def test_addmm_result_is_fresh_and_contiguous():
    a, b, c = _rand((4, 5), kiln.float64, 0), _rand((5, 3), kiln.float64, 1), _rand((4, 3), kiln.float64, 2)
    r = kiln.addmm(c, a, b)
    assert r.is_contiguous()
    r[0, 0] = 100.0  # writable, and not the input's storage
    assert c[0, 0].item() != 100.0


PRODUCTS = {
    "matmul": lambda a, b, c: kiln.matmul(a, b),
    "mm": lambda a, b, c: kiln.mm(a, b),
    "addmm": lambda a, b, c: kiln.addmm(c, a, b),
    "bmm": lambda a, b, c: kiln.bmm(a.unsqueeze(0), b.unsqueeze(0)),
    "baddbmm": lambda a, b, c: kiln.baddbmm(c, a.unsqueeze(0), b.unsqueeze(0)),
}


@pytest.fixture
def blas_calls(monkeypatch):
    """The counts kiln-cpu sets on OpenBLAS (process-wide), which holds 3 threads meanwhile; kiln-cpu's
    kernels run on 2."""
    if _blas.functions() is None:
        pytest.skip("NumPy's BLAS has no openblas_set_num_threads_local")
    (setter, getter, lib), calls = _blas.functions(), []
    monkeypatch.setattr(_blas, "_found", (lambda n: calls.append(n) or setter(n), getter, lib))
    monkeypatch.setattr(_threads, "get_num_threads", lambda: 2)
    before = setter(3)
    yield calls
    assert setter(before) == 3


@pytest.mark.parametrize("name", PRODUCTS)
def test_products_run_on_the_blas_threads_their_size_warrants(name, blas_calls, monkeypatch):
    monkeypatch.setattr(config, "blas_threads_min_macs", 1 << 21)
    fn = PRODUCTS[name]
    for (m, k, n), want in [
        ((8, 16, 8), []),  # OpenBLAS runs it on one thread anyway: the count is left alone
        ((64, 512, 32), [1, 3]),  # one thread, then the count as it was
        ((128, 256, 128), [2, 3]),  # kiln's thread count (no more than BLAS had)
    ]:
        a, b, c = _rand((m, k), kiln.float32, 0), _rand((k, n), kiln.float32, 1), _rand((n,), kiln.float32, 2)
        blas_calls.clear()
        out = fn(a, b, c)
        assert blas_calls == want, (m, k, n)
        # OpenBLAS's order depends on the CPU's kernel and on the thread count (one thread here, three in
        # the reference): the bound of any order, not the reference's bits
        assert_product_within_bound(out, fn, a, b, c)


def test_products_never_raise_blas_above_its_own_count(blas_calls, monkeypatch):
    monkeypatch.setattr(_threads, "get_num_threads", lambda: 8)
    monkeypatch.setattr(config, "blas_threads_min_macs", 1)
    a, b = _rand((64, 128, 96), kiln.float32, 0), _rand((64, 96, 80), kiln.float32, 1)
    assert_product_within_bound(kiln.bmm(a, b), kiln.bmm, a, b)
    assert blas_calls == []  # 3 threads already: nothing to set
    assert _plugins.kernel_owner("bmm", "cpu", kiln.float32) == "cpu"


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16], ids=str)
def test_half_products_run_on_one_blas_thread_when_small(dtype, blas_calls):
    a, b = _rand((8, 128, 32), dtype, 0), _rand((8, 32, 64), dtype, 1)  # float32 products in the reference
    assert_same(kiln.matmul(a, b), reference(kiln.matmul, a, b))
    assert blas_calls == [1, 3]


def test_concurrent_products_restore_the_blas_count(blas_calls):
    a, b = _rand((8, 128, 32), kiln.float32, 0), _rand((8, 32, 64), kiln.float32, 1)
    errors: list[BaseException] = []

    def multiply():
        try:
            for _ in range(20):
                assert_product_within_bound(kiln.matmul(a, b), kiln.matmul, a, b)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=multiply) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert blas_calls and blas_calls[-1] == 3  # the fixture checks the count is 3 again


def test_products_with_a_blas_whose_count_cannot_be_set(monkeypatch):
    monkeypatch.setattr(_blas, "_found", None)
    monkeypatch.setattr(config, "blas_threads_min_macs", 1)
    a, b, c = _rand((64, 512), kiln.float64, 0), _rand((512, 32), kiln.float64, 1), _rand((32,), kiln.float64, 2)
    for fn in PRODUCTS.values():
        assert_same(fn(a, b, c), reference(fn, a, b, c), ulps=4, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_gemm_called_from_numba_matches_numpy(dtype):
    """The cblas gemm that the convolution loops call without the GIL: transposes, leading dimensions
    wider than the matrices, alpha and beta."""
    from numba import njit

    from kiln_cpu._jit_gemm import NO_TRANS, TRANS, gemm, ptr

    found = _blas.gemm_function(dtype)
    if found is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS whose gemm can be called")

    @njit
    def call(addr, ilp64, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        gemm(addr, ilp64, ta, tb, m, n, k, alpha, ptr(a, 0), lda, ptr(b, 0), ldb, beta, ptr(c, 1), ldc)

    rng = np.random.default_rng(0)
    m, n, k = 7, 5, 9
    for ta, tb in ((NO_TRANS, NO_TRANS), (TRANS, NO_TRANS), (NO_TRANS, TRANS), (TRANS, TRANS)):
        a = rng.standard_normal((k, m + 3) if ta == TRANS else (m, k + 3)).astype(dtype)
        b = rng.standard_normal((n, k + 2) if tb == TRANS else (k, n + 2)).astype(dtype)
        c = rng.standard_normal(1 + m * (n + 4)).astype(dtype)
        op_a = a[:, :m].T if ta == TRANS else a[:, :k]
        op_b = b[:, :k].T if tb == TRANS else b[:, :n]
        want = 0.5 * (op_a.astype(np.float64) @ op_b) + 2.0 * c[1:].reshape(m, n + 4)[:, :n]
        call(
            *found,
            ta,
            tb,
            m,
            n,
            k,
            dtype(0.5),
            a.reshape(-1),
            a.shape[1],
            b.reshape(-1),
            b.shape[1],
            dtype(2.0),
            c,
            n + 4,
        )
        got = c[1:].reshape(m, n + 4)[:, :n]
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype is np.float32 else 1e-12, atol=1e-5)


def test_an_openblas_without_the_thread_count_functions(monkeypatch):
    """An OpenBLAS older than 0.3.27 (no ``openblas_set_num_threads_local``): products keep BLAS's own
    threads and convolutions go to the reference, nothing raises."""
    from kiln_cpu_helpers import F

    monkeypatch.setattr(_blas, "_library_paths", lambda: ["libc.so.6"])  # loads, but has none of them
    monkeypatch.setattr(_blas, "_found", _blas._UNSET)
    monkeypatch.setattr(_blas, "_gemms", None)
    monkeypatch.setattr(config, "blas_threads_min_macs", 1)
    a, b = _rand((64, 512), kiln.float32, 0), _rand((512, 64), kiln.float32, 1)
    assert_same(kiln.matmul(a, b), reference(kiln.matmul, a, b), ulps=4, atol=1e-5)
    x, w = _rand((8, 16, 32, 32), kiln.float32, 2), _rand((8, 16, 3, 3), kiln.float32, 3)
    fn = lambda t: F.conv2d(t, w, padding=1)
    assert_same(fn(x), reference(fn, x))
    assert _blas.functions() is None and _blas.gemm_function(np.float32) is None


def test_a_forked_child_restores_the_count_a_parent_thread_had_set(blas_calls, monkeypatch):
    """A fork while another thread is inside a product (users 1, count 1): the child starts with no users,
    a fresh lock and BLAS's count as it was."""
    setter, getter, _ = _blas.functions()
    setter(1)
    for name, value in (("_users", 1), ("_saved", 3), ("_current", 1), ("_lock", _blas._lock)):
        monkeypatch.setattr(_blas, name, value)
    held = _blas._lock
    held.acquire()  # held by the parent's thread at the fork
    try:
        _blas._after_fork()
        assert getter() == 3 and _blas._users == 0 and _blas._current == 3
        assert _blas._lock is not held and _blas._lock.acquire(timeout=1)
        _blas._lock.release()
    finally:
        held.release()
