"""GEMM: kiln with Intel MKL vs kiln with NumPy's OpenBLAS vs PyTorch, one process, 1 thread and all.

Run with ``python benchmarks/bench_blas.py`` in an env with kiln, kiln-cpu, torch and numpy; install
``kiln-cpu[mkl]`` (the ``mkl`` wheel) for the MKL column, else it is left out and the record says so.
Cases: ``a @ b`` of float32 n x n matrices, n = 256, 1024, 2048, and the MLP and CNN training steps of
``bench_cpu.py`` (``training_models.py``; their products run the chosen BLAS, convolutions always
OpenBLAS), on 1 thread and on every CPU this process may use (``kiln.set_num_threads`` sets both BLAS libraries' counts through kiln-cpu,
``torch.set_num_threads`` PyTorch's). kiln switches between the two libraries with
``kiln_cpu.config.blas`` ("auto": MKL where installed; "openblas").

Method: each library's calls run in blocks (a timeit repeat), the blocks of the three take turns for
``--rounds`` rounds with a pause between blocks (BLAS threads spin after a product, OpenBLAS's for about
0.1 s and Intel OpenMP's for 0.2 s: a block right after another library's would pay for its spinning
threads), and the minimum per-call time over the blocks is kept. Each product is first checked
against PyTorch's. Record: ``benchmarks/results/blas.json``; ratios kiln/PyTorch (below 1: kiln is
faster).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(CPUS))  # every CPU available to each pool; the cases set the counts

import numpy as np  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_overhead import machine_info, write_json_atomically  # noqa: E402
from training_models import STEPS, sgd_steps  # noqa: E402

DEFAULT_OUTPUT = HERE / "results" / "blas.json"
SIZES = (256, 1024, 2048)


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _block_seconds(fn, min_time: float) -> tuple[float, int]:
    """(seconds per call, calls) of one block of about ``min_time`` seconds."""
    timer = timeit.Timer(fn)
    number, elapsed = timer.autorange()
    number = max(1, int(number * min_time / max(elapsed, 1e-9)))
    return timer.timeit(number) / number, number


def _race(calls: dict, libs: list[str], args) -> dict[str, float]:
    """The minimum seconds per call of each library's callable over ``args.rounds`` turns of blocks."""
    best = dict.fromkeys(libs, float("inf"))
    for _ in range(args.rounds):
        for lib in libs:
            time.sleep(args.pause)
            per_call, _number = _block_seconds(calls[lib], args.min_time)
            best[lib] = min(best[lib], per_call)
    return best


def _row(name: str, threads: int, best: dict[str, float], libs: list[str], has_mkl: bool, **extra) -> dict:
    """A record row (ms per call, ratios) for one case, printed as it is made."""
    ms = {lib: best[lib] * 1e3 for lib in libs}
    row = {"name": f"{name} x{threads}", **extra, "threads": threads, "unit": "ms", "times": ms}
    row.update({f"{lib}/torch": ms[lib] / ms["torch"] for lib in libs if lib != "torch"})
    if has_mkl:
        row["mkl/openblas"] = ms["kiln-mkl"] / ms["kiln-openblas"]
    cells = "  ".join(f"{lib} {ms[lib]:9.3f}" for lib in libs)
    ratios = "  ".join(f"{k} {v:.2f}x" for k, v in row.items() if "/" in k)
    print(f"{row['name']:>18}: {cells}   {ratios}", flush=True)
    return row


def _with_blas(config, blas: str, fn):
    """``fn`` run with ``kiln_cpu.config.blas`` set to ``blas``."""

    def call():
        config.blas = blas
        return fn()

    return call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="turns of the three libraries' blocks")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per block (about)")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between blocks (spinning threads)")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter blocks (smoke run)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON record")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.min_time, args.pause = 2, 0.05, 0.05

    import torch

    import kiln
    import kiln_cpu
    from kiln_cpu import _mkl, config

    has_mkl = _mkl.load() is not None
    libs = (["kiln-mkl"] if has_mkl else []) + ["kiln-openblas", "torch"]
    print(f"BLAS with MKL chosen: {kiln_cpu.blas()}")
    if not has_mkl:
        print("MKL is not installed (pip install kiln-cpu[mkl]): the kiln-mkl column is left out", file=sys.stderr)
    rng = np.random.default_rng(0)
    rows = []
    for threads in sorted({1, CPUS}):
        kiln.set_num_threads(threads)
        torch.set_num_threads(threads)
        for n in SIZES:
            a_np = rng.standard_normal((n, n)).astype(np.float32)
            b_np = rng.standard_normal((n, n)).astype(np.float32)
            a_k, b_k = kiln.from_numpy(a_np.copy()), kiln.from_numpy(b_np.copy())
            a_t, b_t = torch.from_numpy(a_np.copy()), torch.from_numpy(b_np.copy())
            expected = (a_t.double() @ b_t.double()).numpy()
            bound = (n + 2) * 2.0**-24 * (np.abs(a_np.astype(np.float64)) @ np.abs(b_np.astype(np.float64)))

            calls = {
                "kiln-mkl": _with_blas(config, "auto", lambda a=a_k, b=b_k: a @ b),
                "kiln-openblas": _with_blas(config, "openblas", lambda a=a_k, b=b_k: a @ b),
                "torch": lambda a=a_t, b=b_t: a @ b,
            }
            for lib in libs:
                got = calls[lib]()
                assert np.all(np.abs(got.numpy().astype(np.float64) - expected) <= bound), f"{lib} {n}: wrong product"
            rows.append(_row(f"matmul {n}", threads, _race(calls, libs, args), libs, has_mkl, n=n))
        for name, make, shape, _what in STEPS:
            k_step, t_step = sgd_steps(kiln, torch, make, shape, rng)
            calls = {
                "kiln-mkl": _with_blas(config, "auto", k_step),
                "kiln-openblas": _with_blas(config, "openblas", k_step),
                "torch": t_step,
            }
            first = float(calls[libs[0]]())  # the same weights and batch: the first losses agree
            assert np.isclose(first, float(t_step()), rtol=1e-4), f"{name}: kiln's loss differs from PyTorch's"
            rows.append(_row(name, threads, _race(calls, libs, args), libs, has_mkl))
    config.blas = "auto"
    record = {
        "benchmark": "blas",
        "units": "ms per call (minimum over blocks); ratios: time / time",
        "settings": {"rounds": args.rounds, "min_time_s": args.min_time, "pause_s": args.pause, "cpus": CPUS},
        "blas": kiln_cpu.blas(),
        "mkl_installed": has_mkl,
        "cpu": _cpu_name(),
        "machine": machine_info(torch),
        "results": rows,
    }
    write_json_atomically(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
