"""Eager per-op overhead: kiln vs PyTorch (CPU) vs NumPy, in one process, on the same data.

Run with ``python benchmarks/bench_overhead.py`` (or ``nox -s bench``). Prints a table of per-call
times in microseconds (the minimum over rounds in which the libraries take turns) with the ratios
kiln/PyTorch and kiln/NumPy, and writes a JSON record to ``benchmarks/results/overhead.json``
(atomically: temp file + rename).

Small tensors make the kernel itself nearly free, so what is measured is the Python and dispatch cost
of one eager op (architecture page, "Correctness and performance": "a few microseconds of Python, not tens"). Everything runs on one thread:
BLAS/OpenMP pools are pinned to one thread before NumPy or PyTorch is imported, and
``torch.set_num_threads(1)``.
"""

from __future__ import annotations

import os

# Pin thread pools before NumPy/PyTorch load their BLAS (they read these variables at import).
for _var in (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import timeit  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_OUTPUT = HERE / "results" / "overhead.json"
LIBS = ("kiln", "torch", "numpy")


# ------------------------------------------------------------------------------------------ timing


def per_call_seconds(fn: Callable[[], object], *, repeat: int, min_time: float) -> float:
    """Minimum per-call time of ``fn`` over ``repeat`` timeit runs, each lasting about ``min_time``."""
    return interleaved_per_call_seconds({"fn": fn}, repeat=repeat, min_time=min_time)["fn"]


def interleaved_per_call_seconds(fns: dict, *, repeat: int, min_time: float) -> dict:
    """Minimum per-call time of each of ``fns`` (name -> callable) over ``repeat`` rounds; each round runs
    every callable in turn for about ``min_time``. Taking turns, the libraries meet the same moments of a
    shared machine's load: timed one after the other, a few seconds of load on one of them moved a ratio
    by half."""
    timers, numbers = {}, {}
    for name, fn in fns.items():
        timers[name] = timeit.Timer(fn)
        number, elapsed = timers[name].autorange()  # the smallest 1, 2, 5, 10, ... taking >= 0.2 s
        numbers[name] = max(1, int(number * min_time / max(elapsed, 1e-9)))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, timer in timers.items():
            best[name] = min(best[name], timer.timeit(numbers[name]) / numbers[name])
    return best


# ------------------------------------------------------------------------------------------- cases


def make_cases(kiln, torch) -> list[dict]:
    """Each case: a name, what it measures, and one zero-argument callable per library (same data).

    With ``torch=None`` the cases have no PyTorch callable (``count_instructions.py`` measures kiln alone).
    """
    rng = np.random.default_rng(0)
    cases = []

    def from_numpy_torch(a):
        return None if torch is None else torch.from_numpy(a.copy())

    def add_case(shape):
        a_np = rng.standard_normal(shape).astype(np.float32)
        b_np = rng.standard_normal(shape).astype(np.float32)
        a_k, b_k = kiln.from_numpy(a_np.copy()), kiln.from_numpy(b_np.copy())
        a_t, b_t = from_numpy_torch(a_np), from_numpy_torch(b_np)
        np.testing.assert_allclose((a_k + b_k).numpy(), a_np + b_np, rtol=1e-6)
        cases.append(
            {
                "name": f"add {'x'.join(map(str, shape))}",
                "what": f"a + b, float32, shape {shape}",
                "kiln": lambda: a_k + b_k,
                "torch": lambda: a_t + b_t,
                "numpy": lambda: a_np + b_np,
            }
        )

    add_case((4,))
    add_case((32, 32))

    # an in-place update (hand-written optimizer steps, gradient accumulation): the in-place variant's checks
    acc_np = rng.standard_normal((32, 32)).astype(np.float32)
    inc_np = rng.standard_normal((32, 32)).astype(np.float32)
    acc_k, inc_k = kiln.from_numpy(acc_np.copy()), kiln.from_numpy(inc_np.copy())
    acc_t, inc_t = from_numpy_torch(acc_np), from_numpy_torch(inc_np)
    acc_np2 = acc_np.copy()
    np.testing.assert_array_equal(acc_k.clone().add_(inc_k).numpy(), acc_np + inc_np)
    cases.append(
        {
            "name": "add_ 32x32",
            "what": "a.add_(b), float32, 32x32, in place; NumPy: a += b",
            "kiln": lambda: acc_k.add_(inc_k),
            "torch": lambda: acc_t.add_(inc_t),
            "numpy": lambda: np.add(acc_np2, inc_np, out=acc_np2),
        }
    )

    # a view: no kernel, no data; only argument parsing, stride arithmetic and the new tensor object
    v_np = rng.standard_normal(8).astype(np.float32)
    v_k, v_t = kiln.from_numpy(v_np.copy()), from_numpy_torch(v_np)
    np.testing.assert_array_equal(v_k.view(2, 4).numpy(), v_np.reshape(2, 4))
    cases.append(
        {
            "name": "view 2x4",
            "what": "a.view(2, 4) of 8 float32 elements; NumPy: a.reshape(2, 4)",
            "kiln": lambda: v_k.view(2, 4),
            "torch": lambda: v_t.view(2, 4),
            "numpy": lambda: v_np.reshape(2, 4),
        }
    )

    # forward + backward of a tiny "layer": (x * w + b).relu().sum().backward()
    x_np = rng.standard_normal((16, 16)).astype(np.float32)
    w_np = rng.standard_normal((16, 16)).astype(np.float32)
    bias_np = rng.standard_normal(16).astype(np.float32)
    x_k = kiln.from_numpy(x_np.copy()).requires_grad_()
    w_k, bias_k = kiln.from_numpy(w_np.copy()), kiln.from_numpy(bias_np.copy())
    x_t = from_numpy_torch(x_np)
    x_t = x_t if x_t is None else x_t.requires_grad_()
    w_t, bias_t = from_numpy_torch(w_np), from_numpy_torch(bias_np)

    def fwd_bwd_kiln():
        x_k.grad = None
        (x_k * w_k + bias_k).relu().sum().backward()

    def fwd_bwd_torch():
        x_t.grad = None
        (x_t * w_t + bias_t).relu().sum().backward()

    def fwd_bwd_numpy():
        # The same computation with its gradient written by hand: what autograd saves us from.
        y = x_np * w_np + bias_np
        _ = np.maximum(y, 0).sum()
        return (y > 0) * w_np

    fwd_bwd_kiln()
    np.testing.assert_allclose(x_k.grad.numpy(), fwd_bwd_numpy(), rtol=1e-6)
    if torch is not None:
        fwd_bwd_torch()
        np.testing.assert_allclose(x_t.grad.numpy(), fwd_bwd_numpy(), rtol=1e-6)
    cases.append(
        {
            "name": "fwd+bwd 16x16",
            "what": "(x*w + b).relu().sum().backward(), x requires grad; NumPy: hand-written gradient",
            "kiln": fwd_bwd_kiln,
            "torch": fwd_bwd_torch,
            "numpy": fwd_bwd_numpy,
        }
    )

    # a hand-written loop's write with autograd (a recurrent layer filling its output buffer): s[i] = y
    buf_np = np.zeros((16, 8), np.float32)
    y_np = rng.standard_normal(8).astype(np.float32)
    buf_k, y_k = kiln.from_numpy(buf_np.copy()), kiln.from_numpy(y_np.copy()).requires_grad_()
    buf_t, y_t = from_numpy_torch(buf_np), from_numpy_torch(y_np)
    y_t = y_t if y_t is None else y_t.requires_grad_()

    def setitem_kiln():
        s = buf_k.clone()
        s[3] = y_k
        return s

    def setitem_torch():
        s = buf_t.clone()
        s[3] = y_t
        return s

    def setitem_numpy():
        s = buf_np.copy()
        s[3] = y_np
        return s

    np.testing.assert_array_equal(setitem_kiln().detach().numpy(), setitem_numpy())
    cases.append(
        {
            "name": "setitem grad",
            "what": "s = buf.clone(); s[3] = y, y (8 floats) requires grad, buf 16x8; NumPy: the same without autograd",
            "kiln": setitem_kiln,
            "torch": setitem_torch,
            "numpy": setitem_numpy,
        }
    )

    m1_np = rng.standard_normal((64, 64)).astype(np.float32)
    m2_np = rng.standard_normal((64, 64)).astype(np.float32)
    m1_k, m2_k = kiln.from_numpy(m1_np.copy()), kiln.from_numpy(m2_np.copy())
    m1_t, m2_t = from_numpy_torch(m1_np), from_numpy_torch(m2_np)
    np.testing.assert_allclose((m1_k @ m2_k).numpy(), m1_np @ m2_np, rtol=1e-4, atol=1e-4)
    cases.append(
        {
            "name": "matmul 64x64",
            "what": "a @ b, float32, 64x64 @ 64x64",
            "kiln": lambda: m1_k @ m2_k,
            "torch": lambda: m1_t @ m2_t,
            "numpy": lambda: m1_np @ m2_np,
        }
    )
    return cases


def import_seconds(module: str, *, repeat: int) -> float:
    """Best-of-``repeat`` wall time of ``import module`` in a fresh interpreter (this one's)."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    best = float("inf")
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, env=env
        )
        best = min(best, float(out.stdout.strip().splitlines()[-1]))
    return best


# ------------------------------------------------------------------------------------------ output


def cpu_model() -> str | None:
    """The CPU's model name (Linux: ``/proc/cpuinfo``; elsewhere what the platform says): the per-op ratios
    against PyTorch differ between CPU makes, so a record names the one it was measured on."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _kiln_blas() -> str | None:
    """Which BLAS runs kiln's products (``kiln_cpu.blas()``), None without kiln-cpu."""
    try:
        import kiln_cpu
    except ImportError:
        return None
    return kiln_cpu.blas()


def machine_info(torch) -> dict:
    """Where a record was measured (``torch`` may be None: a kiln-only record)."""
    import kiln

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "numpy": np.__version__,
        "torch": None if torch is None else torch.__version__,
        "kiln": kiln.__version__,
        "torch_threads": None if torch is None else torch.get_num_threads(),
        "kiln_blas": _kiln_blas(),
        "thread_env": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def one_thread_arguments(doc: str, default_output: Path, min_time: float, argv: list[str] | None) -> argparse.Namespace:
    """The options of a one-thread benchmark (``--repeat``, ``--min-time``, ``--quick``, ``--output``), parsed;
    ``--quick`` already applied."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timeit repeats per case (the minimum is kept)")
    parser.add_argument("--min-time", type=float, default=min_time, help="seconds per timeit repeat (about)")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats (smoke run)")
    parser.add_argument("--output", type=Path, default=default_output, help="where to write the JSON record")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.min_time = 2, 0.02
    return args


def write_one_thread_record(
    args: argparse.Namespace, benchmark: str, units: str, rows: list[dict], torch, **extra
) -> None:
    """The JSON record of a one-thread benchmark run with :func:`one_thread_arguments`, written and announced."""
    record = {
        "benchmark": benchmark,
        "units": units,
        "settings": {"repeat": args.repeat, "min_time_s": args.min_time, "threads": 1},
        **extra,
        "machine": machine_info(torch),
        "results": rows,
    }
    write_json_atomically(args.output, record)
    print(f"wrote {args.output}")


def write_json_atomically(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` through a temp file in the same directory and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the record the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.1f}x"


def print_table(rows: list[dict]) -> None:
    head = f"{'case':<16} {'unit':<4} {'kiln':>9} {'torch':>9} {'numpy':>9} {'kiln/torch':>11} {'kiln/numpy':>11}"
    print(head)
    print("-" * len(head))
    for r in rows:
        t = r["times"]
        print(
            f"{r['name']:<16} {r['unit']:<4} {t['kiln']:>9.2f} {t['torch']:>9.2f} {t['numpy']:>9.2f} "
            f"{fmt_ratio(r['kiln/torch']):>11} {fmt_ratio(r['kiln/numpy']):>11}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="rounds per case (the minimum is kept)")
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per library per round (about)")
    parser.add_argument("--import-repeat", type=int, default=5, help="fresh interpreters per import timing")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats (smoke run)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON record")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.min_time, args.import_repeat = 3, 0.05, 2

    import torch

    import kiln

    torch.set_num_threads(1)
    cases = make_cases(kiln, torch)
    rows = []
    for case in cases:
        seconds = interleaved_per_call_seconds(
            {lib: case[lib] for lib in LIBS}, repeat=args.repeat, min_time=args.min_time
        )
        us = {lib: s * 1e6 for lib, s in seconds.items()}
        rows.append(
            {
                "name": case["name"],
                "what": case["what"],
                "unit": "us",
                "times": us,
                "kiln/torch": us["kiln"] / us["torch"],
                "kiln/numpy": us["kiln"] / us["numpy"],
            }
        )
    imports_ms = {m: import_seconds(m, repeat=args.import_repeat) * 1e3 for m in ("kiln", "torch", "numpy")}
    rows.append(
        {
            "name": "import",
            "what": "import <module> in a fresh interpreter, best of N (wall time)",
            "unit": "ms",
            "times": imports_ms,
            "kiln/torch": imports_ms["kiln"] / imports_ms["torch"],
            "kiln/numpy": imports_ms["kiln"] / imports_ms["numpy"],
        }
    )

    print(
        f"kiln {kiln.__version__} vs torch {torch.__version__} vs numpy {np.__version__} "
        f"(Python {platform.python_version()}, 1 thread); per-call minimum over {args.repeat} repeats"
    )
    print_table(rows)
    print("ratios > 1 mean kiln is slower (kiln time / other library's time, same data, same process)")

    record = {
        "benchmark": "overhead",
        "units": "each result row says its unit: us per call (minimum over repeats) or ms per import",
        "settings": {"repeat": args.repeat, "min_time_s": args.min_time, "import_repeat": args.import_repeat},
        "machine": machine_info(torch),
        "results": rows,
    }
    write_json_atomically(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
