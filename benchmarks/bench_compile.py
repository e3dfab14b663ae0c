"""kiln.compile: compiled kiln vs eager kiln vs eager PyTorch (and NumPy where it has the computation), one
thread, one process.

Run with ``python benchmarks/bench_compile.py`` in an env with kiln, kiln-cpu, kiln-nn, kiln-compile, torch and
numpy. Cases:

* fused pointwise chains on 1M float32 elements — GPT-2's GELU written in ops, ``x*sigmoid(x)+b`` then a sum,
  and an Adam-like update of four tensors — where kiln-compile fuses the chain into one kiln-cpu loop;
* training steps (forward, cross entropy, backward, SGD step) of the MLP and CNN of ``bench_cpu.py``
  (``training_models.py``): eager,
  the model compiled (``kiln.compile(model)``: forward and backward are each one program), and the whole step
  compiled (``kiln.compile(step)``: forward, backward and the optimizer's writes in one program); and the
  whole step with Adam, eager against compiled (its update traced, against kiln-cpu's fused one eagerly); and
  each whole step compiled with ``mode="reduce-overhead"`` (one native function where kiln-cpu takes the
  graph: kiln.compile's whole programs);
* other batch sizes (``shapes`` in the record): for the whole SGD steps, the first call at a new batch size
  (a trace; the fused kernels of the first other size, which read their sizes at run time, serve it), and the
  compiled step at another size (those kernels) against the first size's (kernels made for its shapes).

Each case first checks that compiled and eager kiln agree with PyTorch, then times ``per_call_seconds`` (the
minimum per-call time over repeats; the first calls, which trace and compile, are excluded). Ratios:
compiled kiln / eager kiln and compiled kiln / PyTorch (below 1: faster). Record:
``benchmarks/results/compile.json``. Issue 23 asks for compiled training steps at or below 0.8x PyTorch eager
and a fused chain at least 2x faster than kiln eager.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before NumPy, PyTorch or Numba load

import numpy as np  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_overhead import one_thread_arguments, per_call_seconds, write_one_thread_record  # noqa: E402
from training_models import STEPS  # noqa: E402

DEFAULT_OUTPUT = HERE / "results" / "compile.json"
N = 1 << 20


def _chains(kiln, torch, rng) -> list[dict]:
    def gelu(lib, x):
        return 0.5 * x * (1.0 + lib.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * lib.pow(x, 3.0))))

    def silu_bias_sum(lib, x, b):
        return (x * lib.sigmoid(x) + b).sum()

    def adam_like(lib, p, g, m, v):
        m2 = 0.9 * m + 0.1 * g
        v2 = 0.999 * v + 0.001 * g * g
        return p - 0.01 * m2 / (lib.sqrt(v2) + 1e-8)

    x = rng.standard_normal((1024, N // 1024)).astype(np.float32)
    b = rng.standard_normal(N // 1024).astype(np.float32)
    v = np.abs(x)
    cases = []
    for name, what, fn, arrays in (
        ("GELU (GPT-2, in ops)", "0.5*x*(1+tanh(c*(x+0.044715*x**3))), 1024x1024", gelu, (x,)),
        ("x*sigmoid(x)+b, sum", "a bias broadcast over rows, then the sum of all", silu_bias_sum, (x, b)),
        ("Adam-like update", "p - lr*m'/(sqrt(v')+eps) with the moments' updates, 4 tensors", adam_like, (x, x, x, v)),
    ):
        ka = [kiln.from_numpy(a.copy()) for a in arrays]
        ta = [torch.from_numpy(a.copy()) for a in arrays]
        compiled = kiln.compile(lambda *a, fn=fn: fn(kiln, *a))
        cases.append(
            {
                "name": name,
                "what": what,
                "eager": lambda fn=fn, ka=ka: fn(kiln, *ka),
                "compiled": lambda c=compiled, ka=ka: c(*ka),
                "torch": lambda fn=fn, ta=ta: fn(torch, *ta),
                "check": 1e-4,
                "compiled_fn": compiled,
            }
        )
    return cases


def step(lib, model, opt, x, y):
    """One training step of ``model`` in library ``lib``: forward, cross entropy, backward, optimizer step."""
    opt.zero_grad()
    loss = lib.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


_NATIVE = 'whole step compiled with mode="reduce-overhead"'
"""The label of the whole step compiled into one native function where kiln-cpu takes its graph
(kiln.compile._whole; the CNN's convolutions keep the default program)."""


def _steps(kiln, torch, rng) -> list[dict]:
    import kiln.nn

    cases = []
    for (name, make, shape, _), (opt_name, lr) in itertools.product(STEPS, (("SGD", 1e-3), ("Adam", 1e-4))):
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, 10, shape[0])
        t_model = make(torch.nn)
        state = {k: v.detach().numpy().copy() for k, v in t_model.state_dict().items()}
        t_opt = getattr(torch.optim, opt_name)(t_model.parameters(), lr=lr)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        xk, yk = kiln.from_numpy(x), kiln.from_numpy(y)
        labels = {
            "model": "model compiled",
            "native_model": 'model compiled with mode="reduce-overhead"',
            "step": "whole step compiled",
            "native": _NATIVE,
        }
        if opt_name != "SGD":  # the optimizer is what differs: the whole step alone
            labels = {"step": f"whole step with {opt_name} compiled", "native": f"{_NATIVE}, {opt_name}"}
        kinds = {}
        for kind in ("eager", *labels):
            model = make(kiln.nn)
            model.load_state_dict({k: kiln.from_numpy(v.copy()) for k, v in state.items()})
            opt = getattr(kiln.optim, opt_name)(model.parameters(), lr=lr)
            if kind == "eager":
                kinds[kind] = lambda m=model, o=opt, x=xk, y=yk: step(kiln, m, o, x, y)
            elif kind in ("model", "native_model"):
                compiled = kiln.compile(model, mode="reduce-overhead" if kind == "native_model" else None)
                kinds[kind] = lambda m=compiled, o=opt, x=xk, y=yk: step(kiln, m, o, x, y)
            else:
                mode = "reduce-overhead" if kind == "native" else None
                whole = kiln.compile(lambda x, y, m=model, o=opt: step(kiln, m, o, x, y), mode=mode)
                kinds[kind] = lambda w=whole, x=xk, y=yk: w(x, y)
        for kind, label in labels.items():
            cases.append(
                {
                    "name": f"{name}, {label}",
                    "what": f"forward, cross entropy, backward, {opt_name} step",
                    "eager": kinds["eager"],
                    "compiled": kinds[kind],
                    "torch": lambda m=t_model, o=t_opt, x=xt, y=yt: step(torch, m, o, x, y),
                    "check": None,  # the three models train apart from here on; the first losses are compared
                }
            )
        first = [float(kinds[kind]()) for kind in ("eager", *labels)]
        want = float(step(torch, t_model, t_opt, xt, yt))
        assert np.allclose(first, want, rtol=1e-4), (name, opt_name, first, want)
    return cases


def _shapes(kiln, rng, repeat: int, min_time: float) -> list[dict]:
    """The whole SGD steps at other batch sizes (kiln only: a first call at a new size traces; PyTorch's
    ``dynamic`` recompiles take seconds and are not its eager steps): per step, the eager step, the median
    first call at five new sizes (after the first new size, which makes the dynamic kernels), and the
    compiled step at the first size and at another one."""
    import statistics
    import time

    import kiln.nn

    rows = []
    for name, make, shape, _ in STEPS:
        model = make(kiln.nn)
        eager = functools.partial(step, kiln, model, kiln.optim.SGD(model.parameters(), lr=1e-3))
        whole = kiln.compile(eager)
        first, other = shape[0], shape[0] - 1
        data = {
            n: (
                kiln.from_numpy(rng.standard_normal((n, *shape[1:])).astype(np.float32)),
                kiln.from_numpy(rng.integers(0, 10, n)),
            )
            for n in range(first - 7, first + 1)
        }
        for n in (first, first, first, other, other):  # traces (no .grad, then .grad), the dynamic kernels
            whole(*data[n])
        firsts = []
        for n in range(first - 7, first - 2):
            start = time.perf_counter()
            whole(*data[n])
            firsts.append(time.perf_counter() - start)
        assert whole.trace_count <= 8, whole.trace_count
        calls = {
            "eager": functools.partial(eager, *data[first]),
            "compiled": functools.partial(whole, *data[first]),
            "compiled, other size": functools.partial(whole, *data[other]),
        }
        us = {kind: per_call_seconds(call, repeat=repeat, min_time=min_time) * 1e6 for kind, call in calls.items()}
        us["new size, first call"] = statistics.median(firsts) * 1e6
        rows.append(
            {
                "name": f"{name}, whole step compiled, batch {first} then {other} and 5 more sizes",
                "unit": "us",
                "times": us,
                "new size/eager": us["new size, first call"] / us["eager"],
                "other size/first size": us["compiled, other size"] / us["compiled"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = one_thread_arguments(__doc__, DEFAULT_OUTPUT, 0.2, argv)

    import torch

    import kiln
    import kiln.compile

    torch.set_num_threads(1)
    kiln.set_num_threads(1)
    rng = np.random.default_rng(0)
    cases = _chains(kiln, torch, rng) + _steps(kiln, torch, rng)
    rows = []
    for case in cases:
        if case["check"] is not None:
            want = case["torch"]().numpy()
            for kind in ("eager", "compiled", "compiled"):  # the second compiled call replays the program
                got = case[kind]().numpy()
                assert np.allclose(got, want, rtol=case["check"], atol=case["check"]), (case["name"], kind)
        else:
            for kind in ("compiled", "compiled"):
                case[kind]()  # trace and compile outside the timing
        us = {
            lib: per_call_seconds(case[lib], repeat=args.repeat, min_time=args.min_time) * 1e6
            for lib in ("eager", "compiled", "torch")
        }
        rows.append(
            {
                "name": case["name"],
                "what": case["what"],
                "unit": "us",
                "times": us,
                "compiled/eager": us["compiled"] / us["eager"],
                "compiled/torch": us["compiled"] / us["torch"],
                "eager/torch": us["eager"] / us["torch"],
            }
        )
    print(f"kiln {kiln.__version__} (kiln.compile, backend 'kiln') vs torch {torch.__version__} eager; 1 thread")
    head = f"{'case':<34} {'eager us':>9} {'compiled us':>11} {'torch us':>9} {'comp/eager':>10} {'comp/torch':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        t = r["times"]
        print(
            f"{r['name']:<34} {t['eager']:>9.0f} {t['compiled']:>11.0f} {t['torch']:>9.0f} "
            f"{r['compiled/eager']:>9.2f}x {r['compiled/torch']:>9.2f}x"
        )
    shapes = _shapes(kiln, rng, args.repeat, args.min_time)
    print("\nOther batch sizes (whole SGD step): first call at a new size, and the compiled step at another size")
    for r in shapes:
        t = r["times"]
        print(
            f"{r['name']}: eager {t['eager']:.0f} us, new size {t['new size, first call']:.0f} us "
            f"({r['new size/eager']:.1f}x eager), compiled {t['compiled']:.0f} us, at the other size "
            f"{t['compiled, other size']:.0f} us ({r['other size/first size']:.2f}x)"
        )
    write_one_thread_record(
        args, "compile", "us per call (minimum over repeats, traces excluded), 1 thread", rows, torch, shapes=shapes
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
