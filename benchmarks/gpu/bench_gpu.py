"""kiln-cuda against PyTorch's CUDA build on one GPU: time ratios (kiln / PyTorch) and achieved bandwidth.

Run by ``benchmarks/gpu/run.sh`` on a machine with a GPU. Times are medians of CUDA-event timings after a
warm-up (which also compiles kiln's kernels); bandwidth is bytes moved over time, as a fraction of what a
device-to-device copy of the same size achieves. Goals (kiln-cuda's issue): elementwise >= 80% of copy
bandwidth, matmul >= 0.9x PyTorch's speed, softmax/norms <= 1.5x, training steps <= 1.5x.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import kiln
import kiln.nn as knn
import kiln.nn.functional as KF


def _time(fn, sync, event, reps: int = 10) -> float:
    """Median milliseconds of ``fn`` over ``reps`` runs, after two warm-up runs."""
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start, end = event(), event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kiln_time(fn, reps=10):
    return _time(fn, kiln.cuda.synchronize, lambda: kiln.cuda.Event(enable_timing=True), reps)


def torch_time(fn, reps=10):
    return _time(fn, torch.cuda.synchronize, lambda: torch.cuda.Event(enable_timing=True), reps)


def pair(shape, dtype="float32"):
    t = torch.randn(*shape, device="cuda", dtype=getattr(torch, dtype))
    k = kiln.tensor(t.cpu().float().numpy(), device="cuda").to(getattr(kiln, dtype))
    return k, t


def mlp(lib):
    nn = knn if lib is kiln else torch.nn
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def cnn(lib):
    nn = knn if lib is kiln else torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 10),
    )


def step_fn(lib, model, x, y):
    F = KF if lib is kiln else torch.nn.functional
    opt = (kiln.optim if lib is kiln else torch.optim).SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _elementwise(n: int, record) -> None:
    """Copy, add, exp and sum over ``n`` floats, with bandwidth against a device-to-device copy."""
    ka, ta = pair((n,))
    kb_, tb = pair((n,))
    copy_ms = torch_time(lambda: tb.copy_(ta))
    record("copy (device to device)", kiln_time(lambda: kb_.copy_(ka)), copy_ms, 2 * 4 * n, copy_ms)
    record("add 256M", kiln_time(lambda: ka + kb_), torch_time(lambda: ta + tb), 3 * 4 * n, copy_ms * 1.5)
    record("exp 256M", kiln_time(lambda: ka.exp()), torch_time(lambda: ta.exp()), 2 * 4 * n, copy_ms)
    record("sum 256M", kiln_time(lambda: ka.sum()), torch_time(lambda: ta.sum()), 4 * n, copy_ms / 2)


def _compiled_chain(n: int, record) -> None:
    """GPT-2's GELU written in ops over ``n`` floats: kiln eager (a kernel per op) and kiln.compile (kiln-cuda's
    fused kernel), each against PyTorch eager."""
    import kiln.compile

    def gelu(lib, x):
        return 0.5 * x * (1.0 + lib.tanh(0.7978845608028654 * (x + 0.044715 * lib.pow(x, 3.0))))

    kx, tx = pair((n,))
    compiled = kiln.compile(lambda x: gelu(kiln, x))
    compiled(kx)  # traces
    compiled(kx)  # compiles the fused kernel
    t_ms = torch_time(lambda: gelu(torch, tx))
    record("GELU in ops, eager", kiln_time(lambda: gelu(kiln, kx)), t_ms, 2 * 4 * n, None)
    record("GELU in ops, kiln.compile", kiln_time(lambda: compiled(kx)), t_ms, 2 * 4 * n, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/gpu.json")
    p.add_argument("--elements", type=int, default=256 << 20, help="elementwise size (default 256M floats)")
    args = p.parse_args()
    rows = []

    def record(name, k_ms, t_ms, nbytes=None, copy_ms=None):
        row = {"case": name, "kiln_ms": round(k_ms, 4), "torch_ms": round(t_ms, 4), "ratio": round(k_ms / t_ms, 3)}
        if nbytes is not None:
            row["kiln_GBps"] = round(nbytes / k_ms / 1e6, 1)
        if copy_ms is not None:
            row["fraction_of_copy"] = round(copy_ms / k_ms, 3)
        rows.append(row)
        print(json.dumps(row), flush=True)

    _elementwise(args.elements, record)
    _compiled_chain(args.elements // 4, record)
    kx, tx = pair((8192, 4096))
    record("softmax 8192x4096", kiln_time(lambda: KF.softmax(kx, -1)), torch_time(lambda: torch.softmax(tx, -1)))
    kw, tw = pair((4096,))
    record(
        "layer_norm 8192x4096",
        kiln_time(lambda: KF.layer_norm(kx, (4096,), kw)),
        torch_time(lambda: torch.nn.functional.layer_norm(tx, (4096,), tw)),
    )
    for dtype in ("float32", "float16"):
        km, tm = pair((4096, 4096), dtype)
        record(f"matmul 4096 {dtype}", kiln_time(lambda km=km: km @ km, 5), torch_time(lambda tm=tm: tm @ tm, 5))
    ki, ti = pair((32, 64, 56, 56))
    kc, tc = pair((64, 64, 3, 3))
    ki.requires_grad_()
    ti.requires_grad_()
    record(
        "conv2d fwd+bwd 32x64x56x56",
        kiln_time(lambda: KF.conv2d(ki, kc, padding=1).sum().backward(), 5),
        torch_time(lambda: torch.nn.functional.conv2d(ti, tc, padding=1).sum().backward(), 5),
    )
    for name, make, shape in (("MLP step", mlp, (256, 784)), ("CNN step", cnn, (64, 3, 32, 32))):
        torch.manual_seed(0)
        tmodel = make(torch).cuda()
        kmodel = make(kiln).cuda()
        kxx, txx = pair(shape)
        ty = torch.randint(0, 10, (shape[0],), device="cuda")
        ky = kiln.tensor(ty.cpu().numpy(), device="cuda")
        record(name, kiln_time(step_fn(kiln, kmodel, kxx, ky)), torch_time(step_fn(torch, tmodel, txx, ty)))
    result = {"device": kiln.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
