"""Large-tensor throughput of kiln-cpu's Numba kernels vs PyTorch (CPU) vs NumPy, in one process.

Run with ``python benchmarks/bench_cpu.py [--threads N]`` (or ``nox -s bench``) with kiln-cpu installed.
kiln and PyTorch use the same number of threads (``kiln_cpu.set_num_threads``, ``torch.set_num_threads``,
``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set before either loads); NumPy's own loops are
single-threaded, its BLAS (matmul, and so kiln's matmul and convolution) uses the same threads. Prints a
table of per-call times in milliseconds (the minimum over timeit repeats), kiln's effective memory
bandwidth (bytes read and written per second) and the ratios kiln/PyTorch and kiln/NumPy, then the
size below which kiln-cpu hands an op to the NumPy reference kernel and where that crossover was
measured to be. Writes a JSON record to ``benchmarks/results/cpu.json`` (atomically).

Elementwise ops and reductions on 16M float32 elements are bound by memory bandwidth; the
transcendentals (exp, tanh, sigmoid, gelu) by arithmetic where the library has no SIMD math. The
forward+backward cases (softmax, layer and batch norm, max pooling, conv2d), the Adam step and the
MLP/CNN training steps measure whole autograd passes, Python overhead per op included.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _threads_from_argv(argv: list[str]) -> int:
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# Thread pools read these at import: pin them before NumPy, PyTorch or Numba load.
THREADS = _threads_from_argv(sys.argv[1:])
# OpenBLAS too: kiln's matmul and convolution run on NumPy's BLAS, which must get the threads torch gets.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = str(THREADS)

import numpy as np  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_overhead import machine_info, per_call_seconds, write_json_atomically  # noqa: E402
from training_models import STEPS, sgd_steps  # noqa: E402

DEFAULT_OUTPUT = HERE / "results" / "cpu.json"
LIBS = ("kiln", "torch", "numpy")
N = 1 << 24  # 16M elements


def make_cases(kiln, torch) -> list[dict]:
    """Each case: name, what, bytes moved per call, and one zero-argument callable per library."""
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal(N).astype(np.float32)
    b_np = rng.standard_normal(N).astype(np.float32)
    m_np = rng.standard_normal((4096, 4096)).astype(np.float32)
    w_np = rng.standard_normal((4096, 8192)).astype(np.float32)
    v_np = rng.standard_normal((4096, 8192)).astype(np.float32)
    a_k, b_k, m_k = kiln.from_numpy(a_np.copy()), kiln.from_numpy(b_np.copy()), kiln.from_numpy(m_np.copy())
    w_k, v_k = kiln.from_numpy(w_np.copy()), kiln.from_numpy(v_np.copy())
    a_t, b_t, m_t = torch.from_numpy(a_np.copy()), torch.from_numpy(b_np.copy()), torch.from_numpy(m_np.copy())
    w_t, v_t = torch.from_numpy(w_np.copy()), torch.from_numpy(v_np.copy())
    ws_np, vs_np, ws_k, vs_k, ws_t, vs_t = (
        w_np[:, ::2],
        v_np[:, ::2],
        w_k[:, ::2],
        v_k[:, ::2],
        w_t[:, ::2],
        v_t[:, ::2],
    )
    f4 = 4  # bytes per float32
    ah_k, bh_k = a_k.to(kiln.bfloat16), b_k.to(kiln.bfloat16)
    ah_t, bh_t = a_t.to(torch.bfloat16), b_t.to(torch.bfloat16)
    ah_np, bh_np = ah_k.numpy(), bh_k.numpy()
    c_np = a_np > 0
    d_np = a_np.copy()
    d_k, d_t = kiln.from_numpy(a_np.copy()), torch.from_numpy(a_np.copy())
    c_k, c_t = kiln.from_numpy(c_np.copy()), torch.from_numpy(c_np.copy())

    def sigmoid_np(x):
        return 1.0 / (1.0 + np.exp(-x))

    cases = [
        ("add 16M", "a + b, float32, 16M", 3 * N * f4, lambda: a_k + b_k, lambda: a_t + b_t, lambda: a_np + b_np),
        ("mul 16M", "a * b, float32, 16M", 3 * N * f4, lambda: a_k * b_k, lambda: a_t * b_t, lambda: a_np * b_np),
        ("exp 16M", "exp(a), float32, 16M", 2 * N * f4, lambda: a_k.exp(), lambda: a_t.exp(), lambda: np.exp(a_np)),
        ("tanh 16M", "tanh(a), float32", 2 * N * f4, lambda: a_k.tanh(), lambda: a_t.tanh(), lambda: np.tanh(a_np)),
        (
            "sigmoid 16M",
            "sigmoid(a), float32, 16M (NumPy: 1/(1+exp(-a)))",
            2 * N * f4,
            lambda: a_k.sigmoid(),
            lambda: a_t.sigmoid(),
            lambda: sigmoid_np(a_np),
        ),
        (
            "gelu 16M",
            "gelu(a) (erf form), float32, 16M (NumPy has no erf)",
            2 * N * f4,
            lambda: kiln.nn.functional.gelu(a_k),
            lambda: torch.nn.functional.gelu(a_t),
            None,
        ),
        (
            "where 16M",
            "where(a > 0, a, b), float32, 16M (the condition computed once, outside the timing)",
            (3 * f4 + 1) * N,
            lambda: kiln.where(c_k, a_k, b_k),
            lambda: torch.where(c_t, a_t, b_t),
            lambda: np.where(c_np, a_np, b_np),
        ),
        (
            "lerp 16M",
            "lerp(a, b, 0.3), float32, 16M (NumPy: a + 0.3 * (b - a))",
            3 * N * f4,
            lambda: kiln.lerp(a_k, b_k, 0.3),
            lambda: torch.lerp(a_t, b_t, 0.3),
            lambda: a_np + np.float32(0.3) * (b_np - a_np),
        ),
        # in place: each library writes into its own copy of a (the updates keep the values finite and normal)
        (
            "add_ 16M",
            "d.add_(b, alpha=1e-3), float32, 16M (a hand-written SGD step; NumPy: d += 1e-3 * b)",
            3 * N * f4,
            lambda: d_k.add_(b_k, alpha=1e-3),
            lambda: d_t.add_(b_t, alpha=1e-3),
            lambda: np.add(d_np, np.float32(1e-3) * b_np, out=d_np),
        ),
        (
            "mul_ 16M",
            "d.mul_(0.999), float32, 16M",
            2 * N * f4,
            lambda: d_k.mul_(0.999),
            lambda: d_t.mul_(0.999),
            lambda: np.multiply(d_np, np.float32(0.999), out=d_np),
        ),
        (
            "addcmul_ 16M",
            "d.addcmul_(b, b, value=1e-3), float32, 16M (NumPy: d += 1e-3 * b * b)",
            3 * N * f4,
            lambda: d_k.addcmul_(b_k, b_k, value=1e-3),
            lambda: d_t.addcmul_(b_t, b_t, value=1e-3),
            lambda: np.add(d_np, np.float32(1e-3) * b_np * b_np, out=d_np),
        ),
        ("sum 16M", "a.sum(), float32, 16M", N * f4, lambda: a_k.sum(), lambda: a_t.sum(), lambda: a_np.sum()),
        ("max 16M", "a.max(), float32, 16M", N * f4, lambda: a_k.max(), lambda: a_t.max(), lambda: a_np.max()),
        (
            "sum dim1 4096^2",
            "m.sum(1), float32, 4096x4096",
            N * f4,
            lambda: m_k.sum(1),
            lambda: m_t.sum(1),
            lambda: m_np.sum(1),
        ),
        (
            "sum dim0 4096^2",
            "m.sum(0), float32, 4096x4096",
            N * f4,
            lambda: m_k.sum(0),
            lambda: m_t.sum(0),
            lambda: m_np.sum(0),
        ),
        (
            "add strided",
            "w[:, ::2] + v[:, ::2], float32, 4096x4096 views of 4096x8192",
            3 * N * f4,
            lambda: ws_k + vs_k,
            lambda: ws_t + vs_t,
            lambda: ws_np + vs_np,
        ),
        (
            "add transposed",
            "m.T + m.T (dense, transposed), float32, 4096x4096",
            3 * N * f4,
            lambda: m_k.t() + m_k.t(),
            lambda: m_t.t() + m_t.t(),
            lambda: m_np.T + m_np.T,
        ),
        (
            "add bcast row",
            "m + a[:4096] (a row broadcast), float32, 4096x4096",
            2 * N * f4,
            lambda: m_k + a_k[:4096],
            lambda: m_t + a_t[:4096],
            lambda: m_np + a_np[:4096],
        ),
        (
            "add bf16 16M",
            "a + b, bfloat16, 16M (NumPy: ml_dtypes' bfloat16)",
            3 * N * 2,
            lambda: ah_k + bh_k,
            lambda: ah_t + bh_t,
            lambda: ah_np + bh_np,
        ),
        (
            "to float16 16M",
            "a.to(float16), float32 -> float16, 16M",
            N * (f4 + 2),
            lambda: a_k.to(kiln.float16),
            lambda: a_t.to(torch.float16),
            lambda: a_np.astype(np.float16),
        ),
        (
            "cumsum dim1 4096^2",
            "m.cumsum(1), float32, 4096x4096",
            2 * N * f4,
            lambda: m_k.cumsum(1),
            lambda: m_t.cumsum(1),
            lambda: m_np.cumsum(1),
        ),
        (
            "sum strided",
            "w[:, ::2].sum(), float32, 4096x4096 view of 4096x8192",
            N * f4,
            lambda: ws_k.sum(),
            lambda: ws_t.sum(),
            lambda: ws_np.sum(),
        ),
    ]
    cases += _nn_cases(kiln, torch, rng)
    cases += _training_cases(kiln, torch, rng)
    out = []
    for name, what, nbytes, k, t, n in cases:
        np.testing.assert_allclose(_np(k()), _np(t()), rtol=2e-4, atol=1e-2)  # same data, same answer
        out.append({"name": name, "what": what, "bytes": nbytes, "kiln": k, "torch": t, "numpy": n})
    return out


def _training_cases(kiln, torch, rng) -> list[tuple]:
    """conv2d forward and forward+backward, and whole training steps (forward, loss, backward, SGD) of
    an MLP and a small CNN. NumPy has no autograd: its column is empty ("bytes" too: these are
    arithmetic-bound)."""
    import torch.nn.functional as TF

    import kiln.nn.functional as KF

    x_np = rng.standard_normal((32, 64, 32, 32)).astype(np.float32)
    w_np = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    g_np = rng.standard_normal((32, 64, 32, 32)).astype(np.float32)
    xk, wk, gk = (kiln.from_numpy(a.copy()) for a in (x_np, w_np, g_np))
    xt, wt, gt = (torch.from_numpy(a.copy()) for a in (x_np, w_np, g_np))
    xk.requires_grad_(), wk.requires_grad_(), xt.requires_grad_(), wt.requires_grad_()

    def conv_fwd_bwd(F, x, w, g):
        out = F.conv2d(x, w, padding=1)
        out.backward(g)
        grad = w.grad.detach()
        x.grad = w.grad = None
        return grad

    cases = [
        (
            "conv2d fwd",
            "conv2d(x, w, padding=1), float32, x 32x64x32x32, w 64x64x3x3",
            None,
            lambda: KF.conv2d(xk.detach(), wk.detach(), padding=1),
            lambda: TF.conv2d(xt.detach(), wt.detach(), padding=1),
            None,
        ),
        (
            "conv2d fwd+bwd",
            "the same conv2d, then backward to x and w",
            None,
            lambda: conv_fwd_bwd(KF, xk, wk, gk),
            lambda: conv_fwd_bwd(TF, xt, wt, gt),
            None,
        ),
    ]
    cases += _backward_cases(kiln, torch, rng)
    for name, make, shape, what in STEPS:
        k_step, t_step = sgd_steps(kiln, torch, make, shape, rng)
        cases.append((name, f"{what}: forward, cross entropy, backward, SGD step", None, k_step, t_step, None))
    return cases


def _fwd_bwd(fn, x, g, *params):
    """``fn(x, *params)`` then its backward with ``g``; returns x's gradient (and clears the grads)."""
    out = fn(x, *params)
    out.backward(g)
    grad = x.grad.detach()
    for t in (x, *params):
        t.grad = None
    return grad


def _backward_cases(kiln, torch, rng) -> list[tuple]:
    """Forward+backward of the nn primitives with kiln-cpu backward kernels, and an Adam step over 1.1M
    parameters (kiln-cpu's fused update against torch's default, foreach)."""
    import torch.nn.functional as TF

    import kiln.nn.functional as KF

    def pair(shape, scale=1.0):
        a = (rng.standard_normal(shape) * scale).astype(np.float32)
        return kiln.from_numpy(a.copy()).requires_grad_(), torch.from_numpy(a.copy()).requires_grad_()

    def grads(shape):
        a = rng.standard_normal(shape).astype(np.float32)
        return kiln.from_numpy(a.copy()), torch.from_numpy(a.copy())

    (sk, st), (gsk, gst) = pair((4096, 1024)), grads((4096, 1024))
    (lk, lt), (glk, glt) = pair((8192, 1024)), grads((8192, 1024))
    (wk, wt), (bk, bt) = pair(1024), pair(1024)
    (xk, xt), (gxk, gxt) = pair((32, 64, 32, 32)), grads((32, 64, 32, 32))
    (cwk, cwt), (cbk, cbt) = pair(64), pair(64)
    gpk, gpt = grads((32, 64, 16, 16))
    cases = [
        (
            "softmax fwd+bwd",
            "softmax(s, -1) and its backward, float32, 4096x1024",
            None,
            lambda: _fwd_bwd(lambda x: KF.softmax(x, -1), sk, gsk),
            lambda: _fwd_bwd(lambda x: TF.softmax(x, -1), st, gst),
            None,
        ),
        (
            "layer_norm fwd+bwd",
            "layer_norm(l, (1024,), w, b) and its backward to l, w, b, float32, 8192x1024",
            None,
            lambda: _fwd_bwd(lambda x, w, b: KF.layer_norm(x, (1024,), w, b), lk, glk, wk, bk),
            lambda: _fwd_bwd(lambda x, w, b: TF.layer_norm(x, (1024,), w, b), lt, glt, wt, bt),
            None,
        ),
        (
            "batch_norm fwd+bwd",
            "batch_norm (training) and its backward to x, w, b, float32, 32x64x32x32",
            None,
            lambda: _fwd_bwd(lambda x, w, b: KF.batch_norm(x, None, None, w, b, True), xk, gxk, cwk, cbk),
            lambda: _fwd_bwd(lambda x, w, b: TF.batch_norm(x, None, None, w, b, True), xt, gxt, cwt, cbt),
            None,
        ),
        (
            "max_pool2d fwd+bwd",
            "max_pool2d(x, 2) and its backward, float32, 32x64x32x32",
            None,
            lambda: _fwd_bwd(lambda x: KF.max_pool2d(x, 2), xk, gpk),
            lambda: _fwd_bwd(lambda x: TF.max_pool2d(x, 2), xt, gpt),
            None,
        ),
    ]
    shapes = [(1024, 784), (1024,), (256, 1024), (256,), (10, 256), (10,)]
    k_params, t_params = [], []
    for shape in shapes:
        (pk, pt), (gk, gt) = pair(shape, 0.05), grads(shape)
        pk.grad, pt.grad = gk, gt
        k_params.append(pk)
        t_params.append(pt)
    k_adam, t_adam = kiln.optim.Adam(k_params, lr=1e-3), torch.optim.Adam(t_params, lr=1e-3)

    def adam_step(opt, params):
        opt.step()
        return params[-1].detach()

    cases.append(
        (
            "Adam step 1.1M",
            "Adam.step() over 1.07M float32 parameters in 6 tensors (torch: its default, foreach)",
            None,
            lambda: adam_step(k_adam, k_params),
            lambda: adam_step(t_adam, t_params),
            None,
        )
    )
    return cases


def _softmax_np(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layer_norm_np(x, w, b):
    mu = x.mean(axis=-1, keepdims=True)
    c = x - mu
    return c * (1 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + np.float32(1e-5))) * w + b


def _nn_cases(kiln, torch, rng) -> list[tuple]:
    """softmax, log_softmax, layer norm and matmul (float32; matmul's "bytes" are its operands and result:
    it is bound by BLAS arithmetic, not memory)."""
    import torch.nn.functional as TF

    import kiln.nn.functional as KF

    s_np = rng.standard_normal((4096, 1024)).astype(np.float32)
    l_np = rng.standard_normal((8192, 1024)).astype(np.float32)
    w_np, b_np = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
    s_k, l_k, w_k, b_k = (kiln.from_numpy(a.copy()) for a in (s_np, l_np, w_np, b_np))
    s_t, l_t, w_t, b_t = (torch.from_numpy(a.copy()) for a in (s_np, l_np, w_np, b_np))
    f4 = 4
    cases = [
        (
            "softmax 4096x1k",
            "softmax(s, -1), float32, 4096x1024",
            2 * s_np.size * f4,
            lambda: KF.softmax(s_k, -1),
            lambda: torch.softmax(s_t, -1),
            lambda: _softmax_np(s_np),
        ),
        (
            "log_softmax 4k",
            "log_softmax(s, -1), float32, 4096x1024 (NumPy: log of the softmax)",
            2 * s_np.size * f4,
            lambda: KF.log_softmax(s_k, -1),
            lambda: torch.log_softmax(s_t, -1),
            lambda: np.log(_softmax_np(s_np)),
        ),
        (
            "layer_norm 8k",
            "layer_norm(l, (1024,), w, b), float32, 8192x1024",
            2 * l_np.size * f4,
            lambda: KF.layer_norm(l_k, (1024,), w_k, b_k),
            lambda: TF.layer_norm(l_t, (1024,), w_t, b_t),
            lambda: _layer_norm_np(l_np, w_np, b_np),
        ),
    ]
    for n in (256, 1024, 2048):
        a_np = rng.standard_normal((n, n)).astype(np.float32)
        b2_np = rng.standard_normal((n, n)).astype(np.float32)
        a_k, b2_k = kiln.from_numpy(a_np.copy()), kiln.from_numpy(b2_np.copy())
        a_t, b2_t = torch.from_numpy(a_np.copy()), torch.from_numpy(b2_np.copy())
        cases.append(
            (
                f"matmul {n}",
                f"a @ b, float32, {n}x{n} (NumPy's BLAS under kiln)",
                3 * n * n * f4,
                lambda a_k=a_k, b2_k=b2_k: a_k @ b2_k,
                lambda a_t=a_t, b2_t=b2_t: a_t @ b2_t,
                lambda a_np=a_np, b2_np=b2_np: a_np @ b2_np,
            )
        )
    return cases


def _np(x):
    """A result as a float64 NumPy array (half-precision tensors widened first: torch has no bfloat16 NumPy)."""
    if hasattr(x, "float") and str(x.dtype).endswith(("bfloat16", "float16")):
        x = x.float()
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x, dtype=np.float64)


def crossover(kiln, config, *, repeat: int, min_time: float) -> list[dict]:
    """Per size: the Numba kernel vs the NumPy reference kernel (kiln-cpu's own small-size path)."""
    rows = []
    saved = config.min_numel
    rng = np.random.default_rng(1)
    try:
        for n in (1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20):
            x = kiln.from_numpy(rng.standard_normal(n).astype(np.float32))
            row = {"numel": n}
            for name, fn in (("add", lambda x=x: x + x), ("exp", lambda x=x: x.exp()), ("sum", lambda x=x: x.sum())):
                times = {}
                for path, threshold in (("numba", 0), ("reference", 1 << 62)):
                    config.min_numel = threshold
                    fn()  # compile or load from the cache outside the timing
                    times[path] = per_call_seconds(fn, repeat=repeat, min_time=min_time) * 1e6
                row[name] = {"numba_us": times["numba"], "reference_us": times["reference"]}
            rows.append(row)
    finally:
        config.min_numel = saved
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=THREADS, help="threads for kiln and PyTorch")
    parser.add_argument("--repeat", type=int, default=5, help="timeit repeats per case (the minimum is kept)")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per timeit repeat (about)")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats (smoke run)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON record")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.min_time = 2, 0.05

    import torch

    import kiln
    from kiln._plugins import kernel_owner

    torch.set_num_threads(args.threads)
    backend = kernel_owner("add", "cpu", kiln.float32)
    if backend != "cpu":
        print(f"kiln-cpu is not installed: kiln runs the {backend} kernels", file=sys.stderr)
        config = None
    else:
        import kiln_cpu
        from kiln_cpu import config

        kiln_cpu.set_num_threads(args.threads)

    cases = make_cases(kiln, torch)  # also compiles (or loads from Numba's cache) every kernel used
    rows = []
    for case in cases:
        ms = {
            lib: per_call_seconds(case[lib], repeat=args.repeat, min_time=args.min_time) * 1e3
            for lib in LIBS
            if case[lib] is not None
        }
        nbytes = case["bytes"]
        rows.append(
            {
                "name": case["name"],
                "what": case["what"],
                "unit": "ms",
                "times": ms,
                "kiln_GBps": nbytes / ms["kiln"] / 1e6 if nbytes else None,
                "torch_GBps": nbytes / ms["torch"] / 1e6 if nbytes else None,
                "kiln/torch": ms["kiln"] / ms["torch"],
                "kiln/numpy": ms["kiln"] / ms["numpy"] if "numpy" in ms else None,
            }
        )
    cross = crossover(kiln, config, repeat=args.repeat, min_time=args.min_time / 4) if config else []

    print(
        f"kiln {kiln.__version__} ({backend} kernels) vs torch {torch.__version__} vs numpy {np.__version__}; "
        f"{args.threads} thread(s) for kiln and torch; per-call minimum over {args.repeat} repeats"
    )
    head = (
        f"{'case':<16} {'kiln ms':>8} {'torch ms':>9} {'numpy ms':>9} {'kiln GB/s':>10} {'torch GB/s':>10} "
        f"{'kiln/torch':>10} {'kiln/numpy':>10}"
    )
    print(head)
    print("-" * len(head))

    def cell(value, width: int, fmt: str, suffix: str = "") -> str:
        return f"{'-':>{width}}" if value is None else f"{format(value, fmt) + suffix:>{width}}"

    for r in rows:
        t = r["times"]
        print(
            f"{r['name']:<16} {t['kiln']:>8.2f} {t['torch']:>9.2f} {cell(t.get('numpy'), 9, '.2f')} "
            f"{cell(r['kiln_GBps'], 10, '.1f')} {cell(r['torch_GBps'], 10, '.1f')} {r['kiln/torch']:>9.2f}x "
            f"{cell(r['kiln/numpy'], 10, '.2f', 'x')}"
        )
    print("ratios > 1 mean kiln is slower (kiln time / other library's time, same data, same process)")
    if cross:
        print(f"\nsmall sizes: Numba kernel vs NumPy reference kernel, us per call (threshold {config.min_numel})")
        for row in cross:
            cells = "  ".join(
                f"{op} {row[op]['numba_us']:8.1f} / {row[op]['reference_us']:8.1f}" for op in ("add", "exp", "sum")
            )
            print(f"{row['numel']:>8}  {cells}")

    record = {
        "benchmark": "cpu",
        "units": "ms per call (minimum over repeats); GB/s = bytes read and written per call / time",
        "settings": {"repeat": args.repeat, "min_time_s": args.min_time, "threads": args.threads, "numel": N},
        "kernels": backend,
        "min_numel": config.min_numel if config else None,
        "machine": {**machine_info(torch), "kiln_threads": args.threads},
        "results": rows,
        "crossover_us": cross,
    }
    write_json_atomically(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
