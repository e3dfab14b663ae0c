"""``pow`` with a number exponent: kiln (with kiln-cpu) vs PyTorch vs NumPy, one thread, one process.

Run with ``python benchmarks/bench_pow.py`` in an env with kiln, kiln-cpu, torch and numpy. For float32
and float64 tensors of 131,072 and 1,048,576 elements: ``x ** e`` for PyTorch's special exponents (0.5,
2, 3, -1, -0.5, -2) and a general one (2.7); for int32 and int64 tensors: ``x ** e`` for 2, 3 and 5.
Each case first checks that kiln and PyTorch agree (within 1 ulp for float32, bit for bit for the
integers) and then times ``per_call_seconds`` (the minimum per-call time over repeats). The ratios are
kiln/PyTorch and kiln/NumPy (below 1: kiln is faster). Record: ``benchmarks/results/pow.json``.

Issue 24 asks for kiln within 1.5x of PyTorch on the number exponents 0.5, 2, 3, -1 and a general one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before NumPy, PyTorch or Numba load

import numpy as np  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_overhead import one_thread_arguments, per_call_seconds, write_one_thread_record  # noqa: E402

DEFAULT_OUTPUT = HERE / "results" / "pow.json"
SIZES = (1 << 17, 1 << 20)
FLOAT_EXPONENTS = (0.5, 2, 3, -1, -0.5, -2, 2.7)
INT_EXPONENTS = (2, 3, 5)


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance in units in the last place between two float arrays (NaN where both are)."""
    ints = np.int32 if a.dtype == np.float32 else np.int64
    both = np.isnan(a) & np.isnan(b)
    ia, ib = a[~both].view(ints).astype(np.int64), b[~both].view(ints).astype(np.int64)
    ia = np.where(ia < 0, np.iinfo(ints).min - ia, ia)
    ib = np.where(ib < 0, np.iinfo(ints).min - ib, ib)
    return int(np.abs(ia - ib).max(initial=0))


def make_cases(kiln, torch) -> list[dict]:
    """Each case: name, dtype, numel, exponent, one zero-argument callable per library (same data)."""
    rng = np.random.default_rng(0)
    cases = []
    for dtype in ("float32", "float64"):
        for n in SIZES:
            x_np = (np.abs(rng.standard_normal(n)) + 0.1).astype(dtype)  # positive: every exponent defined
            x_k, x_t = kiln.from_numpy(x_np.copy()), torch.from_numpy(x_np.copy())
            for e in FLOAT_EXPONENTS:
                ulps = _ulps((x_k**e).numpy(), (x_t**e).numpy())
                assert ulps <= 1, f"{dtype} {n} ** {e}: kiln and torch {ulps} ulps apart"
                cases.append(
                    {
                        "name": f"{dtype} {n} ** {e}",
                        "dtype": dtype,
                        "numel": n,
                        "exponent": e,
                        "kiln": lambda x=x_k, e=e: x**e,
                        "torch": lambda x=x_t, e=e: x**e,
                        "numpy": lambda x=x_np, e=e: np.power(x, e),
                    }
                )
    for dtype in ("int32", "int64"):
        for n in SIZES:
            x_np = rng.integers(-100, 100, n).astype(dtype)
            x_k, x_t = kiln.from_numpy(x_np.copy()), torch.from_numpy(x_np.copy())
            for e in INT_EXPONENTS:
                np.testing.assert_array_equal((x_k**e).numpy(), (x_t**e).numpy())
                cases.append(
                    {
                        "name": f"{dtype} {n} ** {e}",
                        "dtype": dtype,
                        "numel": n,
                        "exponent": e,
                        "kiln": lambda x=x_k, e=e: x**e,
                        "torch": lambda x=x_t, e=e: x**e,
                        "numpy": lambda x=x_np, e=e: np.power(x, e),
                    }
                )
    return cases


def main(argv: list[str] | None = None) -> int:
    args = one_thread_arguments(__doc__, DEFAULT_OUTPUT, 0.1, argv)

    import torch

    import kiln
    from kiln._plugins import kernel_owner

    torch.set_num_threads(1)
    kiln.set_num_threads(1)
    backend = kernel_owner("pow", "cpu", kiln.float32)
    cases = make_cases(kiln, torch)  # also compiles (or loads from Numba's cache) every loop used
    rows = []
    for case in cases:
        us = {
            lib: per_call_seconds(case[lib], repeat=args.repeat, min_time=args.min_time) * 1e6
            for lib in ("kiln", "torch", "numpy")
        }
        rows.append(
            {
                "name": case["name"],
                "dtype": case["dtype"],
                "numel": case["numel"],
                "exponent": case["exponent"],
                "unit": "us",
                "times": us,
                "kiln/torch": us["kiln"] / us["torch"],
                "kiln/numpy": us["kiln"] / us["numpy"],
            }
        )
    print(
        f"kiln {kiln.__version__} ({backend} kernels) vs torch {torch.__version__} vs numpy {np.__version__}; 1 thread"
    )
    head = f"{'case':<24} {'kiln us':>9} {'torch us':>9} {'numpy us':>9} {'kiln/torch':>10} {'kiln/numpy':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        t = r["times"]
        print(
            f"{r['name']:<24} {t['kiln']:>9.1f} {t['torch']:>9.1f} {t['numpy']:>9.1f} "
            f"{r['kiln/torch']:>9.2f}x {r['kiln/numpy']:>9.2f}x"
        )
    worst = max(rows, key=lambda r: r["kiln/torch"])
    print(f"worst kiln/torch: {worst['kiln/torch']:.2f}x ({worst['name']}); ratios > 1 mean kiln is slower")
    write_one_thread_record(args, "pow", "us per call (minimum over repeats), 1 thread", rows, torch, kernels=backend)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
