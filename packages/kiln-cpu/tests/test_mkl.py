"""The optional MKL GEMM (``kiln-cpu[mkl]``): finding and loading ``libmkl_rt``, the fallback to NumPy's
OpenBLAS, which layouts MKL reads, and (where the ``mkl`` wheel is installed) products against PyTorch's
in every layout, with PyTorch imported before or after MKL is loaded."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch
from kiln_cpu_helpers import assert_product_within_bound

import kiln
import kiln_cpu
from kiln_cpu import _jit_gemm, _mkl, config

HAS_MKL = _mkl.library_path() is not None
needs_mkl = pytest.mark.skipif(not HAS_MKL, reason="the mkl wheel is not installed (pip install kiln-cpu[mkl])")


@pytest.fixture
def fresh(monkeypatch):
    """kiln-cpu's MKL state as in a new process (found again on first use), restored afterwards."""
    monkeypatch.setattr(_mkl, "_found", _mkl._UNSET)
    monkeypatch.setattr(_mkl, "_error", None)


class _FakeDist:
    def __init__(self, root, names):
        self.root, self.files = root, [importlib.metadata.PackagePath(n) for n in names]

    def locate_file(self, path):
        return self.root / path


def _install_fake(monkeypatch, dist):
    def distribution(name):
        if name != "mkl":
            raise AssertionError(name)
        if dist is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return dist

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)


# ----------------------------------------------------------------------------------- finding MKL


def test_not_installed_means_openblas(monkeypatch, fresh):
    _install_fake(monkeypatch, None)
    assert _mkl.library_path() is None
    assert _mkl.load() is None and _mkl.active() is None and _mkl.error() is None
    assert "MKL" not in kiln_cpu.blas() and "BLAS" in kiln_cpu.blas().upper()


def test_library_found_through_the_distributions_files(monkeypatch, tmp_path):
    (tmp_path / "lib").mkdir()
    lib = tmp_path / "lib" / "libmkl_rt.so.3"
    lib.write_bytes(b"")
    _install_fake(monkeypatch, _FakeDist(tmp_path / "site", ["mkl-1.dist-info/METADATA", "../lib/libmkl_rt.so.3"]))
    assert _mkl.library_path() == str(lib.resolve())
    _install_fake(monkeypatch, _FakeDist(tmp_path / "site", ["../lib/libmkl_core.so.3"]))  # no runtime library
    assert _mkl.library_path() is None


def test_a_broken_install_falls_back_and_says_why(monkeypatch, tmp_path, fresh):
    """A file that is not a loadable library: OpenBLAS runs the products, the doctor line says why."""
    (tmp_path / "libmkl_rt.so.3").write_bytes(b"not an ELF file")
    _install_fake(monkeypatch, _FakeDist(tmp_path, ["libmkl_rt.so.3"]))
    assert _mkl.load() is None
    assert "libmkl_rt.so.3" in _mkl.error()
    assert "failed to load" in kiln_cpu.blas()
    a = kiln.from_numpy(np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32))
    assert_product_within_bound(a @ a.t(), kiln.matmul, a, a.t())


# ------------------------------------------------------------------------------- MKL's operands


@pytest.mark.parametrize(
    "case, expected",
    [
        ("contiguous", (_jit_gemm.NO_TRANS, 7)),
        ("transposed", (_jit_gemm.TRANS, 5)),
        ("rows of a wider matrix", (_jit_gemm.NO_TRANS, 12)),
        ("columns of a taller matrix", (_jit_gemm.TRANS, 9)),
        ("one row", (_jit_gemm.NO_TRANS, 7)),
        ("one column", (_jit_gemm.NO_TRANS, 1)),
        ("every other column", None),
        ("broadcast rows", None),
        ("batch of transposed", (_jit_gemm.TRANS, 5)),
        ("reversed rows", None),
    ],
)
def test_operand_layouts(case, expected):
    """(transpose flag, leading dimension) as a row-major CBLAS call reads the matrix (the last two dims);
    None: not readable by BLAS (the product runs NumPy's)."""
    base = np.zeros((9, 12), np.float32)
    x = {
        "contiguous": np.zeros((5, 7), np.float32),
        "transposed": np.zeros((7, 5), np.float32).T,
        "rows of a wider matrix": base[:5, :7],
        "columns of a taller matrix": np.zeros((7, 9), np.float32)[:, :5].T,
        "one row": np.zeros((1, 7), np.float32),
        "one column": np.zeros((5, 1), np.float32),
        "every other column": base[:, ::2],
        "broadcast rows": np.broadcast_to(np.zeros(7, np.float32), (5, 7)),
        "batch of transposed": np.zeros((3, 7, 5), np.float32).transpose(0, 2, 1),
        "reversed rows": np.zeros((5, 7), np.float32)[::-1],
    }[case]
    got = _jit_gemm.operand(*x.shape[-2:], *(s // x.itemsize for s in x.strides[-2:]))
    assert (None if got == (0, 0) else got) == expected


# -------------------------------------------------------------------------------- MKL's products


@pytest.fixture
def mkl_spy(monkeypatch):
    """Records each product MKL takes: the operands' shapes. MKL takes products of any size here (the tests'
    are small: :data:`kiln_cpu.config.mkl_min_macs` would leave most of them to NumPy)."""
    calls = []
    real = _mkl.matmul
    monkeypatch.setattr(config, "mkl_min_macs", 0)
    monkeypatch.setattr(config, "mkl_min_macs_transposed", 0)

    def record(mkl, a, b, *rest):
        out = real(mkl, a, b, *rest)
        if out is not None:
            calls.append((a.shape, b.shape))
        return out

    monkeypatch.setattr(_mkl, "matmul", record)
    return calls


def _tensor(shape, dtype=kiln.float32, seed=0):
    return kiln.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(dtype.numpy))


@needs_mkl
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64], ids=str)
@pytest.mark.parametrize(
    "case",
    ["2-d", "transposed a", "transposed b", "sliced rows", "batched", "batched, b expanded", "large (threads)"],
)
def test_matmul_by_mkl(case, dtype, mkl_spy):
    a, b = {
        "2-d": (_tensor((33, 17), dtype), _tensor((17, 29), dtype, 1)),
        "transposed a": (_tensor((17, 33), dtype).t(), _tensor((17, 29), dtype, 1)),
        "transposed b": (_tensor((33, 17), dtype), _tensor((29, 17), dtype, 1).t()),
        "sliced rows": (_tensor((33, 40), dtype)[:, 3:20], _tensor((17, 29), dtype, 1)),
        "batched": (_tensor((4, 33, 17), dtype), _tensor((4, 17, 29), dtype, 1)),
        "batched, b expanded": (_tensor((4, 33, 17), dtype), _tensor((1, 17, 29), dtype, 1).expand(4, 17, 29)),
        "large (threads)": (_tensor((300, 256), dtype), _tensor((256, 300), dtype, 1)),
    }[case]
    got = kiln.matmul(a, b)
    assert got.dtype is dtype and got.is_contiguous()
    expected = torch.from_numpy(np.array(a.numpy())) @ torch.from_numpy(np.array(b.numpy()))
    tol = 1e-4 if dtype is kiln.float32 else 1e-12
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=tol, atol=tol * a.shape[-1])
    assert len(mkl_spy) == 1
    if dtype is kiln.float32:
        assert_product_within_bound(got, kiln.matmul, a, b)


@needs_mkl
def test_addmm_baddbmm_bmm_by_mkl(mkl_spy):
    x, a, b = _tensor((20, 30)), _tensor((20, 40), seed=1), _tensor((40, 30), seed=2)
    got = kiln.addmm(x, a, b, beta=0.5, alpha=2.0)
    t = [torch.from_numpy(v.numpy()) for v in (x, a, b)]
    np.testing.assert_allclose(got.numpy(), torch.addmm(*t, beta=0.5, alpha=2.0).numpy(), rtol=1e-5, atol=1e-4)
    x3, a3, b3 = _tensor((3, 20, 30)), _tensor((3, 20, 40), seed=1), _tensor((3, 40, 30), seed=2)
    t3 = [torch.from_numpy(v.numpy()) for v in (x3, a3, b3)]
    got3 = kiln.baddbmm(x3, a3, b3, alpha=0.5)
    np.testing.assert_allclose(got3.numpy(), torch.baddbmm(*t3, alpha=0.5).numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(kiln.bmm(a3, b3).numpy(), torch.bmm(t3[1], t3[2]).numpy(), rtol=1e-5, atol=1e-4)
    assert len(mkl_spy) == 3


@needs_mkl
@pytest.mark.parametrize(
    "case", ["openblas chosen", "every other column", "1-d", "broadcast batch", "float16", "empty"]
)
def test_cases_mkl_leaves_to_numpy(case, mkl_spy, monkeypatch):
    """What MKL does not take runs NumPy's product (or the reference's casts), with the same result."""
    a, b = _tensor((12, 10)), _tensor((10, 8), seed=1)
    if case == "openblas chosen":
        monkeypatch.setattr(config, "blas", "openblas")
    elif case == "every other column":
        a = _tensor((12, 20))[:, ::2]
    elif case == "1-d":
        a = _tensor((10,))
    elif case == "broadcast batch":
        a, b = _tensor((2, 3, 12, 10)), _tensor((3, 10, 8), seed=1)
    elif case == "float16":
        a, b = a.half(), b.half()
    elif case == "empty":
        a, b = _tensor((0, 10)), _tensor((10, 8), seed=1)
    got = kiln.matmul(a, b)
    expected = torch.from_numpy(np.array(a.float().numpy())).to(_torch_dtype(a.dtype)) @ torch.from_numpy(
        np.array(b.float().numpy())
    ).to(_torch_dtype(b.dtype))
    assert str(got.dtype).removeprefix("kiln.") == str(expected.dtype).removeprefix("torch.")
    np.testing.assert_allclose(got.float().numpy(), expected.float().numpy(), rtol=2e-3, atol=2e-3)
    assert mkl_spy == []


@needs_mkl
def test_small_products_stay_with_numpy(mkl_spy, monkeypatch):
    """Below ``mkl_min_macs`` multiply-adds NumPy's product runs (MKL gains nothing there); from it on MKL
    does, batches counted whole."""
    monkeypatch.setattr(config, "mkl_min_macs", 4096)
    small, large = (_tensor((16, 16)), _tensor((16, 15), seed=1)), (_tensor((16, 16)), _tensor((16, 16), seed=1))
    batch = (_tensor((2, 16, 16)), _tensor((2, 16, 8), seed=1))
    for a, b in (small, large, batch):
        np.testing.assert_allclose(kiln.matmul(a, b).numpy(), np.matmul(a.numpy(), b.numpy()), rtol=1e-5, atol=1e-5)
    assert mkl_spy == [((16, 16), (16, 16)), ((2, 16, 16), (2, 16, 8))]


@needs_mkl
def test_small_products_with_a_transposed_operand_go_to_mkl(mkl_spy, monkeypatch):
    """By default a product whose second operand is transposed (``x @ w.t()``, where OpenBLAS is slow) runs
    MKL from ``mkl_min_macs_transposed`` multiply-adds, a plain one only from ``mkl_min_macs``."""
    monkeypatch.setattr(config, "mkl_min_macs", 1 << 19)
    monkeypatch.setattr(config, "mkl_min_macs_transposed", 1 << 15)
    x, w = _tensor((40, 40)), _tensor((40, 40), seed=1)
    tiny = _tensor((8, 8), seed=2)
    for a, b in ((x, w.t()), (x, w), (tiny, tiny.t()), (x.t(), w)):
        np.testing.assert_allclose(kiln.matmul(a, b).numpy(), np.matmul(a.numpy(), b.numpy()), rtol=1e-5, atol=1e-4)
    assert mkl_spy == [((40, 40), (40, 40))]  # only x @ w.t(): 64,000 multiply-adds
    got = kiln.addmm(_tensor((40,), seed=3), x, w.t())  # the same rule for addmm
    assert len(mkl_spy) == 2
    expected = torch.addmm(*(torch.from_numpy(np.array(t.numpy())) for t in (_tensor((40,), seed=3), x, w.t())))
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-4)


@needs_mkl
@pytest.mark.parametrize("past", ["count", "batch stride", "leading dimension"])
def test_sizes_past_32_bits_are_refused(past):
    """MKL's sizes are 32-bit (LP64): a batch count, batch stride or leading dimension of 2**31 or more makes
    the call return False before it writes anything (the caller then runs NumPy's product), where a cut to
    32 bits would compute fewer products, or read the wrong memory, and report success. Expanded views
    reach those sizes without the memory."""
    mkl = _mkl.load()
    gemm, batch_gemm = mkl.gemm[np.dtype(np.float32)]
    big = 1 << 31
    one = np.ones(1, np.float32)
    a = {
        "count": np.broadcast_to(one, (big + 1, 1, 1)),
        "batch stride": np.lib.stride_tricks.as_strided(one, (2, 1, 1), (big * 4, 4, 4)),
        "leading dimension": np.lib.stride_tricks.as_strided(one, (2, 1), (big * 4, 4)),
    }[past]
    b = np.broadcast_to(one, (*a.shape[:-2], 1, 1))
    out = np.full((1,) * a.ndim, 7.0, np.float32)
    assert not _jit_gemm.mkl_product(gemm, batch_gemm, mkl.threads_address, 1, 1.0, 0.0, a, b, out)
    assert out.ravel()[0] == 7.0


@needs_mkl
def test_an_unreadable_operand_is_refused_before_the_result_is_made(monkeypatch):
    """An operand with no unit stride is left to NumPy before any array is allocated or copied."""
    mkl = _mkl.load()
    made = []
    real_empty = np.empty
    monkeypatch.setattr(_mkl.np, "empty", lambda *a, **k: made.append(a) or real_empty(*a, **k))
    a = np.ones((8, 16), np.float32)[:, ::2]
    assert _mkl.matmul(mkl, a, np.ones((8, 8), np.float32), np.ones(8, np.float32), 1.0, 1.0) is None
    assert made == []


def _torch_dtype(d):
    return getattr(torch, str(d).removeprefix("kiln."))


@needs_mkl
def test_a_batch_without_mkls_batch_gemm_runs_numpys(mkl_spy, monkeypatch):
    """An MKL without ``cblas_?gemm_batch_strided`` (address 0) takes 2-d products and batches of one;
    a larger batch runs NumPy's product, with the same result."""
    mkl = _mkl.load()
    monkeypatch.setitem(mkl.gemm, np.dtype(np.float32), (mkl.gemm[np.dtype(np.float32)][0], 0))
    for a, b in (
        (_tensor((3, 12, 10)), _tensor((3, 10, 8), seed=1)),
        (_tensor((1, 12, 10)), _tensor((1, 10, 8), seed=1)),
        (_tensor((12, 10)), _tensor((10, 8), seed=1)),
    ):
        np.testing.assert_allclose(kiln.matmul(a, b).numpy(), np.matmul(a.numpy(), b.numpy()), rtol=1e-5, atol=1e-5)
    assert mkl_spy == [((1, 12, 10), (1, 10, 8)), ((12, 10), (10, 8))]


@needs_mkl
def test_products_from_many_threads_at_once():
    """MKL's calls run without the GIL: products of several shapes and layouts from 8 threads at once each
    get their own result, and every thread's MKL setting comes back."""
    mkl = _mkl.load()
    cases = [
        (_tensor((64, 48), seed=i), _tensor((40, 48), seed=i + 1).t() if i % 2 else _tensor((48, 40), seed=i + 1))
        for i in range(8)
    ]
    expected = [np.matmul(a.numpy(), b.numpy()) for a, b in cases]
    barrier = threading.Barrier(len(cases))
    errors = []

    def work(i):
        try:
            barrier.wait(timeout=30)
            before = mkl.set_threads(0)
            for _ in range(50):
                np.testing.assert_allclose(kiln.matmul(*cases[i]).numpy(), expected[i], rtol=1e-5, atol=1e-4)
            assert mkl.set_threads(before) == 0
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


@needs_mkl
def test_thread_setting_restored():
    mkl = _mkl.load()
    before = mkl.set_threads(0)  # 0: MKL's global setting (what the calling thread had: nothing local)
    kiln.matmul(_tensor((300, 300)), _tensor((300, 300), seed=1))
    assert mkl.set_threads(before) == 0


@needs_mkl
@pytest.mark.parametrize("order", ["torch first", "mkl first"])
def test_mkl_and_pytorchs_own_mkl_in_one_process(order):
    """PyTorch links its own MKL statically and exports its symbols; the wheel's, loaded with
    RTLD_LOCAL and called through its C entry points, works beside it in either import order."""
    code = textwrap.dedent(
        f"""
        import numpy as np
        if {order == "torch first"}:
            import torch
        import kiln, kiln_cpu
        from kiln_cpu import _mkl
        assert _mkl.load() is not None, kiln_cpu.blas()
        import torch
        a = np.random.default_rng(0).standard_normal((300, 300)).astype(np.float32)
        k = (kiln.from_numpy(a) @ kiln.from_numpy(a)).numpy()
        t = (torch.from_numpy(a) @ torch.from_numpy(a)).numpy()
        assert np.allclose(k, t, rtol=1e-4, atol=1e-3)
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_doctor_says_which_blas_runs(capsys, monkeypatch):
    """``kiln doctor`` prints kiln-cpu's BLAS line: MKL where it runs, else NumPy's OpenBLAS (and why
    not MKL, where it is installed)."""
    from kiln._cli import main

    main(["doctor"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("BLAS: "))
    assert line == f"BLAS: {kiln_cpu.blas()}"
    assert ("Math Kernel Library" in line) == HAS_MKL
    monkeypatch.setattr(config, "blas", "openblas")
    assert "Math Kernel Library" not in kiln_cpu.blas()
    assert ("KILN_CPU_BLAS=openblas" in kiln_cpu.blas()) == HAS_MKL
