"""Mixed precision (kiln-amp) vs PyTorch's ``torch.autocast``: training steps, time and memory, on the CPU.

Run with ``python benchmarks/bench_amp.py`` (or ``nox -s bench``) with kiln-amp and kiln-cpu installed.
Two models, built the same way in both libraries with the same initial weights (PyTorch's
initialisation, copied into kiln through NumPy): an MLP (784-256-256-10, ReLU, batch 64) and the
digits demo's CNN (``docs/examples/train_digits.py``: two 3x3 convolutions, a 2x2 max pool, a linear
head, on 1x8x8 images, batch 64; without its Dropout, whose random masks would differ between the
libraries). Each is trained with SGD in three precisions:

* ``fp32``: no autocast;
* ``bf16``: the forward and the loss under ``autocast("cpu", dtype=bfloat16)``;
* ``fp16``: under ``autocast("cpu", dtype=float16)``, with ``amp.GradScaler("cpu")`` scaling the loss,
  unscaling the gradients and skipping steps whose gradients overflowed.

One step is ``zero_grad``, forward under autocast, cross entropy, backward, optimizer step (through
the scaler for fp16). Both libraries run on one thread (``kiln.set_num_threads(1)``,
``torch.set_num_threads(1)``, the BLAS/OpenMP variables pinned before either loads). Before timing,
the first step's loss must agree between the libraries (to the precision's tolerance).

Time: per configuration, warm-up steps, then kiln and PyTorch steps alternate (so load on a shared
machine falls on both alike); the **median** step time is reported, in ms. The garbage collector stays
on, as in a training loop.

Memory: each configuration of each library runs again in a fresh interpreter that imports only that
library. It takes a few warm-up steps (kernels loaded or compiled, optimizer state created), sets the
gradients to None (``zero_grad()``), resets the kernel's resident-set high-water mark
(``/proc/self/clear_refs``), reads the resident set as the baseline, runs a few more steps and reads the
high-water mark (``VmHWM``: what ``ru_maxrss`` reports, but resettable, and not inherited from the
parent across ``exec`` as ``ru_maxrss`` is). The row is the growth, the peak memory of a training step
above the model at rest (its weights, the optimizer's state, the libraries' caches and kernels): the
gradients, the activations kept for backward, autocast's low-precision copies of the weights and every
temporary alive at the peak.
The children run with glibc's ``MALLOC_MMAP_THRESHOLD_=4096`` so that every buffer of a page or more is
mapped when allocated and unmapped when freed: the resident set then follows the live buffers. With the
default settings (and kiln-cpu's, which raise glibc's thresholds deliberately) freed buffers stay in the
heap for reuse, and after the warm-up a step's growth reads about zero for both libraries: that would
measure the allocator, not the step. Linux only (the memory rows are skipped elsewhere); the resident
set is counted in pages, so growths under ~0.1 MB are noise.

Prints a table and writes a JSON record to ``benchmarks/results/amp.json`` (atomically). Ratios:
kiln/torch per configuration (> 1: kiln slower or larger), and autocast/fp32 per library (< 1: mixed
precision pays off).
"""

from __future__ import annotations

import os

# Thread pools read these at import: pin them before NumPy, PyTorch or Numba load (the memory children
# inherit them).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_overhead import machine_info, write_json_atomically  # noqa: E402

DEFAULT_OUTPUT = HERE / "results" / "amp.json"
LIBS = ("kiln", "torch")
BATCH = 64
PRECISIONS = ("fp32", "bf16", "fp16")
PRECISION_WHAT = {
    "fp32": "float32, no autocast",
    "bf16": 'autocast("cpu", dtype=bfloat16)',
    "fp16": 'autocast("cpu", dtype=float16) + GradScaler("cpu")',
}
# First-step loss: how closely the libraries must agree (the same weights, data and policy; the low
# precision's rounding differs with the order of the sums).
LOSS_RTOL = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 5e-3}
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4096"}


# ------------------------------------------------------------------------------------------- models


def mlp(nn):
    return nn.Sequential(
        nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10),
    )  # fmt: skip


def cnn(nn):
    """The digits demo's model (docs/examples/train_digits.py) without its Dropout."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),  # (N, 16, 8, 8)
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),  # (N, 32, 8, 8)
        nn.MaxPool2d(2), nn.Flatten(),  # (N, 32 * 4 * 4)
        nn.Linear(32 * 4 * 4, 10),
    )  # fmt: skip


MODELS = {
    "MLP": (mlp, (BATCH, 784), "784-256-256-10 ReLU MLP, batch 64"),
    "CNN": (cnn, (BATCH, 1, 8, 8), "digits CNN (2 conv 3x3, max pool, linear), batch 64 of 1x8x8"),
}


def make_inputs() -> dict[str, np.ndarray]:
    """Initial weights (PyTorch's initialisation, seed 0) and one batch per model, as NumPy arrays."""
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    arrays = {}
    for name, (make, shape, _) in MODELS.items():
        for key, value in make(torch.nn).state_dict().items():
            arrays[f"{name}/w/{key}"] = value.detach().numpy().copy()
        arrays[f"{name}/x"] = rng.standard_normal(shape).astype(np.float32)
        arrays[f"{name}/y"] = rng.integers(0, 10, shape[0]).astype(np.int64)
    return arrays


class Trainer:
    """One model, optimizer and batch in one library, and its training step in one precision."""

    def __init__(self, lib, model_name: str, precision: str, arrays: dict[str, np.ndarray]) -> None:
        import importlib

        importlib.import_module(f"{lib.__name__}.nn")
        importlib.import_module(f"{lib.__name__}.amp")
        make = MODELS[model_name][0]
        self.lib, self.precision = lib, precision
        self.model = make(lib.nn)
        prefix = f"{model_name}/w/"
        state = {k[len(prefix) :]: lib.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith(prefix)}
        self.model.load_state_dict(state)
        self.x = lib.from_numpy(arrays[f"{model_name}/x"].copy())
        self.y = lib.from_numpy(arrays[f"{model_name}/y"].copy())
        self.opt = lib.optim.SGD(self.model.parameters(), lr=1e-2)
        self.dtype = {"fp32": None, "bf16": lib.bfloat16, "fp16": lib.float16}[precision]
        self.scaler = lib.amp.GradScaler("cpu") if precision == "fp16" else None

    def region(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return self.lib.autocast("cpu", dtype=self.dtype)

    def step(self):
        """One training step; returns the loss (detached, float32) and the logits' dtype."""
        lib, opt = self.lib, self.opt
        opt.zero_grad()
        with self.region():
            logits = self.model(self.x)
            loss = lib.nn.functional.cross_entropy(logits, self.y)
        if self.scaler is None:
            loss.backward()
            opt.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(opt)
            self.scaler.update()
        return loss.detach(), logits.dtype


# -------------------------------------------------------------------------------------------- timing


def time_config(kiln, torch, model_name: str, precision: str, arrays, *, warmup: int, reps: int) -> dict:
    """Median step time (ms) of both libraries, steps alternating; checks the first step's loss."""
    trainers = {
        "kiln": Trainer(kiln, model_name, precision, arrays),
        "torch": Trainer(torch, model_name, precision, arrays),
    }
    first = {lib: tr.step() for lib, tr in trainers.items()}
    losses = {lib: float(loss.item()) for lib, (loss, _) in first.items()}
    dtypes = {lib: str(dtype).rsplit(".", 1)[-1] for lib, (_, dtype) in first.items()}
    np.testing.assert_allclose(losses["kiln"], losses["torch"], rtol=LOSS_RTOL[precision])
    if dtypes["kiln"] != dtypes["torch"]:
        raise AssertionError(
            f"{model_name} {precision}: logits are {dtypes['kiln']} in kiln, {dtypes['torch']} in torch"
        )
    for _ in range(max(0, warmup - 1)):
        for tr in trainers.values():
            tr.step()
    samples = {lib: [] for lib in LIBS}
    for _ in range(reps):
        for lib, tr in trainers.items():
            t0 = time.perf_counter()
            tr.step()
            samples[lib].append(time.perf_counter() - t0)
    out = {
        "median_ms": {lib: float(np.median(s)) * 1e3 for lib, s in samples.items()},
        "min_ms": {lib: min(s) * 1e3 for lib, s in samples.items()},
        "first_loss": losses,
        "logits_dtype": dtypes["kiln"],
    }
    if precision == "fp16":
        out["final_scale"] = {lib: float(tr.scaler.get_scale()) for lib, tr in trainers.items()}
    return out


# -------------------------------------------------------------------------------------------- memory


def _proc_status_kb() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in KiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def memory_child(spec: dict) -> dict:
    """Runs in a fresh interpreter: one library, one model, one precision (see the module docstring)."""
    import importlib

    lib = importlib.import_module(spec["lib"])
    for sub in ("nn", "optim", "amp"):
        importlib.import_module(f"{spec['lib']}.{sub}")
    lib.set_num_threads(1)
    # raw numbers for the record; built - imported is not the model's size: torch's first optimizer
    # imports some 800 modules more (torch._dynamo's), kiln's kernels load at their first call
    imported = _proc_status_kb()["VmRSS"]
    with np.load(spec["arrays"]) as f:
        arrays = {k: f[k] for k in f.files}
    trainer = Trainer(lib, spec["model"], spec["precision"], arrays)
    del arrays
    built = _proc_status_kb()["VmRSS"]
    for _ in range(spec["warmup"]):
        trainer.step()
    trainer.opt.zero_grad()  # the baseline holds no gradients (set to None): a step's peak counts them
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the resident-set high-water mark (VmHWM) to the current resident set
    baseline = _proc_status_kb()["VmRSS"]
    for _ in range(spec["steps"]):
        trainer.step()
    peak = _proc_status_kb()["VmHWM"]
    return {"imported_kb": imported, "built_kb": built, "baseline_kb": baseline, "peak_kb": peak}


def measure_memory(lib: str, model_name: str, precision: str, arrays_path: str, *, warmup: int, steps: int) -> dict:
    spec = {
        "lib": lib,
        "model": model_name,
        "precision": precision,
        "arrays": arrays_path,
        "warmup": warmup,
        "steps": steps,
    }
    env = {**os.environ, **MALLOC_ENV}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--memory-child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=HERE,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {lib} {model_name} {precision} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_supported() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return "VmHWM" in _proc_status_kb()
    except OSError:
        return False


# -------------------------------------------------------------------------------------------- output


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def build_rows(timing: dict, memory: dict | None) -> list[dict]:
    """Rows in the other records' shape (``times`` holds each row's measure, in its ``unit``)."""
    rows = []
    for measure in ("time", "memory"):
        if measure == "memory" and memory is None:
            continue
        for model_name, (_, _, model_what) in MODELS.items():
            for precision in PRECISIONS:
                key = (model_name, precision)
                if measure == "time":
                    values = timing[key]["median_ms"]
                    base = timing[(model_name, "fp32")]["median_ms"]
                    row = {
                        "name": f"{model_name} {precision}",
                        "what": f"{model_what}: one SGD training step, {PRECISION_WHAT[precision]} (median)",
                        "unit": "ms",
                        "times": values,
                        "min_ms": timing[key]["min_ms"],
                        "first_loss": timing[key]["first_loss"],
                        "logits_dtype": timing[key]["logits_dtype"],
                    }
                    if "final_scale" in timing[key]:
                        row["final_scale"] = timing[key]["final_scale"]
                else:
                    growth = {lib: (m["peak_kb"] - m["baseline_kb"]) / 1024 for lib, m in memory[key].items()}
                    base_mem = memory[(model_name, "fp32")]
                    base = {lib: (m["peak_kb"] - m["baseline_kb"]) / 1024 for lib, m in base_mem.items()}
                    values = growth
                    row = {
                        "name": f"{model_name} {precision} peak",
                        "what": (
                            f"{model_name}, {PRECISION_WHAT[precision]}: resident-set peak of a step above the "
                            "resident set between steps (fresh process per library)"
                        ),
                        "unit": "MB",
                        "times": values,
                        # the whole resident set at the baseline (interpreter, library, model, kernels)
                        "resident_MB": {lib: m["baseline_kb"] / 1024 for lib, m in memory[key].items()},
                    }
                row["kiln/torch"] = _ratio(values["kiln"], values["torch"])
                if precision != "fp32":
                    for lib in LIBS:
                        row[f"{lib} autocast/fp32"] = _ratio(values[lib], base[lib])
                rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    def ratio(value, width: int) -> str:
        return f"{'-' if value is None else f'{value:.2f}x':>{width}}"

    head = (
        f"{'case':<14} {'unit':<4} {'kiln':>8} {'torch':>8} {'kiln/torch':>10} "
        f"{'kiln amp/fp32':>13} {'torch amp/fp32':>14}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        t = r["times"]
        print(
            f"{r['name']:<14} {r['unit']:<4} {t['kiln']:>8.2f} {t['torch']:>8.2f} {ratio(r['kiln/torch'], 10)} "
            f"{ratio(r.get('kiln autocast/fp32'), 13)} {ratio(r.get('torch autocast/fp32'), 14)}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per configuration")
    parser.add_argument("--reps", type=int, default=100, help="timed steps per configuration and library")
    parser.add_argument("--mem-steps", type=int, default=5, help="steps measured per memory child")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory rows (no subprocesses)")
    parser.add_argument("--quick", action="store_true", help="fewer steps (smoke run)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON record")
    parser.add_argument("--memory-child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return 0
    if args.quick:
        args.warmup, args.reps, args.mem_steps = 3, 10, 2
    if importlib.util.find_spec("kiln.amp") is None:
        # nox's bench session must install it; failing here would stop the scripts that follow
        print("bench_amp.py: skipped, kiln-amp is not installed (pip install -e packages/kiln-amp)", file=sys.stderr)
        return 0

    import torch

    import kiln
    import kiln.amp
    import kiln.nn
    from kiln._plugins import kernel_owner

    kiln.set_num_threads(1)
    torch.set_num_threads(1)
    kernels = {
        f"{op} {dtype}": kernel_owner(op, "cpu", getattr(kiln, dtype))
        for op in ("matmul", "addmm", "convolution", "_amp_non_finite_check_and_unscale_")
        for dtype in ("float32", "bfloat16", "float16")
    }
    arrays = make_inputs()
    started = time.perf_counter()
    timing = {}
    for model_name in MODELS:
        for precision in PRECISIONS:
            timing[(model_name, precision)] = time_config(
                kiln, torch, model_name, precision, arrays, warmup=args.warmup, reps=args.reps
            )
            gc.collect()
    memory = None
    if args.no_memory:
        pass
    elif not memory_supported():
        print("memory rows skipped: /proc/self/clear_refs and VmHWM are Linux-only", file=sys.stderr)
    else:
        memory = {}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "arrays.npz")
            np.savez(path, **arrays)
            for model_name in MODELS:
                for precision in PRECISIONS:
                    memory[(model_name, precision)] = {
                        lib: measure_memory(lib, model_name, precision, path, warmup=3, steps=args.mem_steps)
                        for lib in LIBS
                    }
    rows = build_rows(timing, memory)

    print(
        f"kiln {kiln.__version__} vs torch {torch.__version__}, 1 thread; training step = zero_grad, forward "
        f"under autocast, cross entropy, backward, SGD step; median of {args.reps} steps after {args.warmup} warm-up"
    )
    print_table(rows)
    print(
        "kiln/torch > 1: kiln slower (or more memory); autocast/fp32 < 1: mixed precision is cheaper than float32 "
        "in that library. MB rows: peak resident growth of a step (fresh process, see the module docstring)"
    )
    for r in rows:
        if "final_scale" in r and r["final_scale"]["kiln"] != r["final_scale"]["torch"]:
            print(f"note: {r['name']}: GradScaler's scale ended at {r['final_scale']} (steps skipped differ)")
    print(f"({time.perf_counter() - started:.0f} s)")

    record = {
        "benchmark": "amp",
        "units": "ms rows: median step time; MB rows: peak resident growth of a step (each row's 'times' holds "
        "its measure in its unit)",
        "settings": {
            "warmup": args.warmup,
            "reps": args.reps,
            "memory_steps": None if memory is None else args.mem_steps,
            "threads": 1,
            "batch": BATCH,
            "optimizer": "SGD lr=1e-2",
            "memory_env": None if memory is None else MALLOC_ENV,
        },
        "kernels": kernels,
        "machine": {**machine_info(torch), "kiln_threads": kiln.get_num_threads()},
        "results": rows,
        "memory_detail_kb": None if memory is None else {f"{m} {p}": per_lib for (m, p), per_lib in memory.items()},
    }
    write_json_atomically(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
