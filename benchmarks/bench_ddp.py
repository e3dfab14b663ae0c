"""DistributedDataParallel: kiln's vs PyTorch's, both on Gloo, 2 processes on one machine.

Run with ``python benchmarks/bench_ddp.py`` in an env with kiln, kiln-cpu, kiln-nn, kiln-distributed
(``[gloo]``) and torch (without kiln-distributed the script says so and writes nothing). The script
starts 2 worker processes of itself (``--worker``, with ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and
``WORLD_SIZE`` in their environment, as a launcher would set them). Each worker holds two process
groups at once, both Gloo over loopback TCP on ports of their own: kiln's
(``kiln.distributed.init_process_group("gloo")``, which drives PyTorch's ``ProcessGroupGloo``) and
PyTorch's (``torch.distributed.init_process_group("gloo")``).

Models, built the same way in both libraries with the same initial weights (PyTorch's initialisation,
copied into kiln through NumPy), each rank with its own batch:

* ``MLP``: 784-512-512-10, ReLU, batch 64 per rank (2.7 MB of float32 gradients);
* ``MLP-L``: 784-1024-1024-10, batch 64 per rank (7.5 MB: communication weighs more);
* ``CNN``: the digits demo's CNN (``docs/examples/train_digits.py``'s ``make_model`` without its
  Dropout, whose random masks would differ between the libraries), batch 64 of 1x8x8 per rank (40 kB).

One step is ``zero_grad``, forward, cross entropy, backward, ``SGD.step`` (lr 0.01). Measured per library
and model, with the two libraries' steps alternating (load on a shared machine falls on both alike):

* ``ddp``: the step of the model wrapped in the library's ``DistributedDataParallel`` (default buckets:
  25 MiB, a first one of 1 MiB; gradients all-reduced bucket by bucket during backward);
* ``compute``: the same step of an unwrapped copy of the model on the same per-rank batch: no
  communication (the process group is there, unused), both ranks computing at the same time;
* ``comm``: one synchronous ``all_reduce`` of a flat float32 tensor with as many elements as the model
  has parameters: what communicating the gradients costs when nothing overlaps it.

Before each timed step the ranks meet at a barrier of that library (outside the timing), so that each
rank's i-th step runs at the same time; a step's time is the slower rank's, and the **median** over the
timed steps (100 after 5 warm-up steps) is reported, in ms, with the fastest step beside it
(``min_ms``). Loopback Gloo times scatter widely from step to step on a small machine (the threads of
both ranks share its cores), hence the many steps. Before timing, the first DDP step's loss and
averaged gradients must agree between the libraries.

The share of communication that the DDP step hides behind the backward pass is
``hidden% = 100 * (1 - (ddp - compute) / comm)`` of the medians, clipped to [0, 100]: 100 when the DDP
step costs no more than the computation alone, 0 when it costs at least computation plus communication
in sequence. ``from_min_ms`` holds the same formula applied to the fastest steps.

Everything runs on one thread per process (the BLAS/OpenMP/Numba variables pinned to 1 before NumPy,
PyTorch or Numba load, ``kiln.set_num_threads(1)``, ``torch.set_num_threads(1)``); Gloo's own threads
come on top. kiln's per-call fingerprint check of collectives is off (``KILN_DISTRIBUTED_DEBUG=OFF``) so
that ``comm`` times the bare all-reduce (DDP's bucket all-reduces skip the check anyway). On a 2-core
machine the 2 ranks take a core each, so Gloo's threads compete with the backward pass for it.

On Linux the script also says what share of the machine's CPU time other processes took during the
run (``/proc/stat`` less the workers' own time; ``settings.others_cpu_share`` in the record) and warns
above 5%: on a shared machine, rerun until it is near 0.

Prints a table and writes a JSON record to ``benchmarks/results/ddp.json`` (atomically). Rows ``<model>
ddp``, ``<model> compute`` and ``<model> comm`` in ms with the ratio kiln/torch (> 1: kiln slower), and
``<model> hidden`` in percent. About half a minute.
"""

from __future__ import annotations

import os

# Thread pools read these at import: pin them before NumPy, PyTorch or Numba load (the workers inherit them).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ["KILN_DISTRIBUTED_DEBUG"] = "OFF"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_amp import cnn  # noqa: E402 - the digits demo's model, as bench_amp measures it
from bench_overhead import machine_info, write_json_atomically  # noqa: E402

DEFAULT_OUTPUT = HERE / "results" / "ddp.json"
LIBS = ("kiln", "torch")
WORLD_SIZE = 2
BATCH = 64
LR = 0.01
MEASURES = ("ddp", "compute", "comm")
WORKER_TIMEOUT = 900  # seconds for the whole run of the workers; nothing may hang


# ------------------------------------------------------------------------------------------- models


def mlp(nn, hidden: int = 512):
    """784-hidden-hidden-10 ReLU MLP of ``nn`` (``kiln.nn`` or ``torch.nn``)."""
    return nn.Sequential(
        nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10),
    )  # fmt: skip


def mlp_large(nn):
    """784-1024-1024-10 ReLU MLP: 7.5 MB of float32 gradients."""
    return mlp(nn, 1024)


MODELS = {
    "MLP": (mlp, (BATCH, 784), "784-512-512-10 ReLU MLP, batch 64 per rank"),
    "MLP-L": (mlp_large, (BATCH, 784), "784-1024-1024-10 ReLU MLP, batch 64 per rank"),
    "CNN": (cnn, (BATCH, 1, 8, 8), "digits CNN (2 conv 3x3, max pool, linear), batch 64 of 1x8x8 per rank"),
}


def make_arrays(rank: int) -> dict[str, np.ndarray]:
    """Initial weights (PyTorch's initialisation, seed 0: the same on every rank) and this rank's batch."""
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(1000 + rank)
    arrays = {}
    for name, (make, shape, _) in MODELS.items():
        for key, value in make(torch.nn).state_dict().items():
            arrays[f"{name}/w/{key}"] = value.detach().numpy().copy()
        arrays[f"{name}/x"] = rng.standard_normal(shape).astype(np.float32)
        arrays[f"{name}/y"] = rng.integers(0, 10, shape[0]).astype(np.int64)
    return arrays


class Trainer:
    """One model (plain or DDP-wrapped), its SGD optimizer and this rank's batch, in one library."""

    def __init__(self, lib, ddp_class, model_name: str, arrays: dict[str, np.ndarray], wrap: bool) -> None:
        self.lib = lib
        model = MODELS[model_name][0](lib.nn)
        prefix = f"{model_name}/w/"
        model.load_state_dict(
            {k[len(prefix) :]: lib.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith(prefix)}
        )
        self.model = ddp_class(model) if wrap else model
        self.optimizer = lib.optim.SGD(self.model.parameters(), lr=LR)
        self.loss_fn = lib.nn.CrossEntropyLoss()
        self.x = lib.from_numpy(arrays[f"{model_name}/x"].copy())
        self.y = lib.from_numpy(arrays[f"{model_name}/y"].copy())

    def step(self) -> float:
        """One training step; returns the loss."""
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def forward_backward(self) -> float:
        """The first step without the optimizer step: the loss, with the averaged gradients in ``.grad``."""
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(self.x), self.y)
        loss.backward()
        return loss.item()

    def grads(self) -> list[np.ndarray]:
        """Copies of the parameters' gradients, in parameter order."""
        return [p.grad.numpy().copy() for p in self.model.parameters()]


# ------------------------------------------------------------------------------------------- worker


def worker(args: argparse.Namespace) -> int:
    """One rank: both libraries' process groups, every measurement, per-step times into a JSON file."""
    import datetime

    import torch
    import torch.distributed as td
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    import kiln
    import kiln.distributed as kd
    import kiln.nn  # kiln.nn and kiln.optim
    from kiln.nn.parallel import DistributedDataParallel as KilnDDP

    torch.set_num_threads(1)
    kiln.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=120)
    kd.init_process_group("gloo", timeout=timeout)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    td.init_process_group(
        "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{args.torch_port}", rank=rank, world_size=world,
        timeout=timeout,
    )  # fmt: skip
    dist = {"kiln": kd, "torch": td}
    libs = {"kiln": (kiln, KilnDDP), "torch": (torch, TorchDDP)}
    arrays = make_arrays(rank)
    models = list(MODELS) if not args.models else args.models
    times: dict[str, dict[str, dict[str, list[float]]]] = {}
    info: dict[str, dict] = {}
    for name in models:
        ddp = {lib: Trainer(*libs[lib], name, arrays, wrap=True) for lib in LIBS}
        plain = {lib: Trainer(*libs[lib], name, arrays, wrap=False) for lib in LIBS}
        n_params = sum(int(np.prod(v.shape)) for k, v in arrays.items() if k.startswith(f"{name}/w/"))
        flat = {"kiln": kiln.ones(n_params), "torch": torch.ones(n_params)}

        # The libraries agree on the first DDP step: the loss (this rank's batch) and the averaged gradients.
        losses = {lib: ddp[lib].forward_backward() for lib in LIBS}
        assert abs(losses["kiln"] - losses["torch"]) <= 1e-4 * abs(losses["torch"]), (name, losses)
        for gk, gt in zip(ddp["kiln"].grads(), ddp["torch"].grads(), strict=True):
            np.testing.assert_allclose(gk, gt, rtol=1e-4, atol=1e-6, err_msg=f"{name}: averaged gradients differ")

        step = {
            "ddp": {lib: ddp[lib].step for lib in LIBS},
            "compute": {lib: plain[lib].step for lib in LIBS},
            "comm": {lib: (lambda d=dist[lib], t=flat[lib]: d.all_reduce(t)) for lib in LIBS},
        }
        times[name] = {m: {lib: [] for lib in LIBS} for m in MEASURES}
        for measure in MEASURES:
            for i in range(args.warmup + args.steps):
                for lib in LIBS:
                    dist[lib].barrier()
                    t0 = time.perf_counter()
                    step[measure][lib]()
                    elapsed = time.perf_counter() - t0
                    if i >= args.warmup:
                        times[name][measure][lib].append(elapsed)
        info[name] = {"parameters": n_params, "gradient_bytes": 4 * n_params, "first_loss": losses}

    Path(args.result).write_text(json.dumps({"rank": rank, "times": times, "info": info}))
    td.barrier()
    td.destroy_process_group()
    kd.destroy_process_group()
    return 0


# ------------------------------------------------------------------------------------------- parent


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free a moment ago on the loopback interface."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_workers(args: argparse.Namespace, tmp: Path) -> list[dict]:
    """Start the ranks, wait for them (with a timeout; the others are killed when one fails), read their files."""
    kiln_port, torch_port = free_ports(2)
    procs = []
    for rank in range(WORLD_SIZE):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(kiln_port), RANK=str(rank))
        env.update(WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--torch-port", str(torch_port)]
        cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--result", str(tmp / f"rank{rank}.json")]
        cmd += [arg for m in args.models or () for arg in ("--model", m)]
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.monotonic() + WORKER_TIMEOUT
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                raise RuntimeError(f"a worker failed or timed out: exit codes {[p.returncode for p in procs]}")
            time.sleep(0.1)
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError(f"a worker failed: exit codes {[p.returncode for p in procs]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return [json.loads((tmp / f"rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


def busy_cpu_seconds() -> float | None:
    """CPU time every process of the machine has used since boot (user + nice + system), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    return sum(int(v) for v in fields[1:4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU time of this process's finished (waited-for) children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def kernel_owners() -> dict[str, str]:
    """Which plugin runs kiln's float32 kernels of these models on cpu (kiln-cpu's ``cpu``, or the reference)."""
    from kiln.plugins import kernel_owner

    return {op: kernel_owner(op, "cpu") for op in ("addmm", "convolution", "relu", "_log_softmax", "sum")}


def hidden_share(t: dict[str, dict[str, float]], lib: str) -> float:
    """The percentage of the all-reduce time that the DDP step hides: 100 * (1 - (ddp - compute) / comm), clipped."""
    exposed = t["ddp"][lib] - t["compute"][lib]
    return min(100.0, max(0.0, 100.0 * (1.0 - exposed / t["comm"][lib])))


def summarize(per_rank: list[dict]) -> tuple[list[dict], dict]:
    """Rows of the record: per model the median of the slower rank's step times, the ratios, hidden%."""
    rows = []
    info = per_rank[0]["info"]
    for name in per_rank[0]["times"]:
        med, low = {}, {}
        for measure in MEASURES:
            med[measure], low[measure] = {}, {}
            for lib in LIBS:
                steps = [1e3 * max(s) for s in zip(*(r["times"][name][measure][lib] for r in per_rank), strict=True)]
                med[measure][lib], low[measure][lib] = statistics.median(steps), min(steps)
        for measure in MEASURES:
            what = {
                "ddp": "step of the DDP-wrapped model on 2 ranks (forward, loss, backward with bucketed "
                "all-reduce, SGD)",
                "compute": "the same step without DDP (no communication), both ranks computing",
                "comm": f"one synchronous all_reduce of {info[name]['gradient_bytes'] / 1e6:.2f} MB "
                "(all the gradients)",
            }[measure]
            rows.append(
                {
                    "name": f"{name} {measure}",
                    "unit": "ms",
                    "times": med[measure],
                    "min_ms": low[measure],
                    "kiln/torch": med[measure]["kiln"] / med[measure]["torch"],
                    "what": f"{MODELS[name][2]}: {what} (median)",
                }
            )
        rows.append(
            {
                "name": f"{name} hidden",
                "unit": "%",
                "times": {lib: hidden_share(med, lib) for lib in LIBS},
                "from_min_ms": {lib: hidden_share(low, lib) for lib in LIBS},
                "what": f"{MODELS[name][2]}: share of the all-reduce time hidden behind backward, "
                "100 * (1 - (ddp - compute) / comm), clipped to [0, 100]",
            }
        )
    return rows, info


def print_table(rows: list[dict]) -> None:
    """The record's rows as a text table."""
    print(f"{'case':<16} {'unit':>4} {'kiln':>9} {'PyTorch':>9} {'kiln/PyTorch':>13}")
    for r in rows:
        ratio = f"{r['kiln/torch']:.2f}x" if "kiln/torch" in r else "-"
        t = r["times"]
        print(f"{r['name']:<16} {r['unit']:>4} {t['kiln']:9.2f} {t['torch']:9.2f} {ratio:>13}")


def main(argv: list[str] | None = None) -> int:
    """Parse the options; as the parent: run the workers, print the table, write the record."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="timed steps per measure (default 100)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them (default 5)")
    p.add_argument("--quick", action="store_true", help="smoke run: 5 timed steps, 2 warm-up steps")
    p.add_argument("--model", dest="models", action="append", choices=list(MODELS), help="only this model (repeatable)")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"record path (default {DEFAULT_OUTPUT})")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--torch-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = 5, 2
    if args.worker:
        return worker(args)
    if importlib.util.find_spec("kiln_distributed") is None:
        # (nox -s bench runs every script; this one needs kiln-distributed in its environment)
        print(
            "bench_ddp.py: skipped, kiln-distributed is not installed "
            "(pip install -e 'packages/kiln-distributed[gloo]')",
            file=sys.stderr,
        )
        return 0

    import torch

    busy0, ours0, wall0 = busy_cpu_seconds(), children_cpu_seconds(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_ddp.") as tmp:
        per_rank = run_workers(args, Path(tmp))
    busy1, ours1, wall1 = busy_cpu_seconds(), children_cpu_seconds(), time.monotonic()
    rows, info = summarize(per_rank)
    print_table(rows)
    # Other programs on a shared machine distort these times more than most: say how busy they kept it.
    others = None
    if busy0 is not None and busy1 is not None:
        others = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / ((wall1 - wall0) * (os.cpu_count() or 1))
        print(f"other processes used {others:.0%} of the machine's CPU time during the run")
        if others > 0.05:
            print("warning: the machine was not idle; these times are not reliable", file=sys.stderr)
    torch.set_num_threads(1)  # what the workers ran with, for the machine record
    record = {
        "benchmark": "ddp",
        "machine": machine_info(torch),
        "settings": {
            "world_size": WORLD_SIZE,
            "backend": "gloo",
            "batch_per_rank": BATCH,
            "optimizer": f"SGD lr={LR}",
            "steps": args.steps,
            "warmup": args.warmup,
            "threads": 1,
            "others_cpu_share": None if others is None else round(others, 3),
        },
        "kernels": kernel_owners(),
        "models": info,
        "units": "ms rows: median over steps of the slower rank's time (min_ms: the fastest step); "
        "% rows: hidden share of the all-reduce",
        "results": rows,
    }
    record["machine"]["kiln_threads"] = 1
    write_json_atomically(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
