"""DataLoader throughput: kiln.data vs torch.utils.data (CPU) vs a plain NumPy loop, in one process.

Run with ``python benchmarks/bench_data.py`` (or ``nox -s bench``). Every library loads the same
in-memory data set (uint8 32x32x3 images, like CIFAR-10) through the same per-sample transform
(to float CHW in [0, 1], random horizontal flip, per-channel normalization), collates batches of 64,
and reads every batch; the table gives samples per second (best of the repeats) for ``num_workers``
0 and 2, and the ratios kiln/PyTorch (> 1: kiln is faster) and kiln/NumPy. The NumPy row is a
single-process loop doing the same work by hand: what the loader's machinery costs. The JSON record
goes to ``benchmarks/results/data.json`` (atomically: temp file + rename).

Worker start-up is part of each epoch (``persistent_workers=False``, PyTorch's default), as in a
training loop. Thread pools are pinned to one thread so that the workers do not oversubscribe the CPUs.
"""

from __future__ import annotations

import os

for _var in (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_overhead import machine_info, write_json_atomically  # noqa: E402

DEFAULT_OUTPUT = HERE / "results" / "data.json"
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


# ------------------------------------------------------------------------------------------ data sets


class KilnImages:
    """uint8 HWC images through kiln.data.transforms (ToTensor, RandomHorizontalFlip, Normalize)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        from kiln.data import transforms as T

        self.images, self.labels = images, labels
        self.transform = T.Compose([T.ToTensor(), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD)])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), int(self.labels[i])


class TorchImages:
    """The same images and transform written with torch ops (what torchvision's transforms do)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        import torch

        self.images, self.labels = images, labels
        self.mean = torch.tensor(MEAN).view(-1, 1, 1)
        self.std = torch.tensor(STD).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        import torch

        x = torch.from_numpy(self.images[i]).permute(2, 0, 1).float().div_(255)
        if torch.rand(1).item() < 0.5:
            x = x.flip(-1)
        return (x - self.mean) / self.std, int(self.labels[i])


def numpy_epoch(images: np.ndarray, labels: np.ndarray, batch_size: int, rng: np.random.Generator) -> int:
    """One epoch of the same work by hand in NumPy (shuffle, transform, stack); returns the sample count."""
    mean = np.array(MEAN, dtype=np.float32).reshape(-1, 1, 1)
    std = np.array(STD, dtype=np.float32).reshape(-1, 1, 1)
    order = rng.permutation(len(images))
    seen = 0
    for start in range(0, len(order), batch_size):
        xs = []
        for i in order[start : start + batch_size]:
            x = images[i].transpose(2, 0, 1).astype(np.float32) / np.float32(255)
            if rng.random() < 0.5:
                x = x[:, :, ::-1]
            xs.append((x - mean) / std)
        batch = np.stack(xs)
        _ = labels[order[start : start + batch_size]]
        seen += len(batch)
    return seen


# ------------------------------------------------------------------------------------------ timing


def epoch_rate(make_loader, n: int, repeat: int) -> float:
    """Best samples/second over ``repeat`` epochs, each through a fresh iterator (workers included)."""
    best = 0.0
    for _ in range(repeat):
        loader = make_loader()
        start = time.perf_counter()
        seen = 0
        for x, _y in loader:
            seen += len(x)
        elapsed = time.perf_counter() - start
        assert seen == n, (seen, n)
        best = max(best, seen / elapsed)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096, help="data set size")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="epochs per setting (the best is kept)")
    parser.add_argument("--quick", action="store_true", help="a smaller data set and fewer repeats (smoke run)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON record")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.repeat = 1024, 2

    import torch
    import torch.utils.data as tud

    import kiln
    import kiln.data as kd

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(args.samples, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=args.samples).astype(np.int64)
    kds, tds = KilnImages(images, labels), TorchImages(images, labels)

    # Same values from both transforms when the flip agrees (checked without the random flip).
    kx = kd.transforms.Normalize(MEAN, STD)(kd.transforms.ToTensor()(images[0]))
    tx = (torch.from_numpy(images[0]).permute(2, 0, 1).float() / 255 - tds.mean) / tds.std
    np.testing.assert_allclose(kx.numpy(), tx.numpy(), rtol=1e-5, atol=1e-6)

    rows = []
    for nw in (0, 2):
        k = epoch_rate(
            lambda nw=nw: kd.DataLoader(kds, batch_size=args.batch_size, shuffle=True, num_workers=nw),
            args.samples,
            args.repeat,
        )
        t = epoch_rate(
            lambda nw=nw: tud.DataLoader(tds, batch_size=args.batch_size, shuffle=True, num_workers=nw),
            args.samples,
            args.repeat,
        )
        rows.append({"name": f"num_workers={nw}", "samples_per_s": {"kiln": k, "torch": t}, "kiln/torch": k / t})
    np_best = 0.0
    for _ in range(args.repeat):
        start = time.perf_counter()
        seen = numpy_epoch(images, labels, args.batch_size, rng)
        np_best = max(np_best, seen / (time.perf_counter() - start))
    for r in rows:
        r["samples_per_s"]["numpy"] = np_best
        r["kiln/numpy"] = r["samples_per_s"]["kiln"] / np_best

    print(
        f"kiln {kiln.__version__} vs torch {torch.__version__} vs numpy {np.__version__} "
        f"(Python {platform.python_version()}); {args.samples} samples of uint8 32x32x3, batch {args.batch_size}, "
        f"best of {args.repeat} epochs"
    )
    head = f"{'setting':<14} {'kiln':>10} {'torch':>10} {'numpy':>10} {'kiln/torch':>11} {'kiln/numpy':>11}"
    print(head)
    print("-" * len(head))
    for r in rows:
        s = r["samples_per_s"]
        print(
            f"{r['name']:<14} {s['kiln']:>10.0f} {s['torch']:>10.0f} {s['numpy']:>10.0f} "
            f"{r['kiln/torch']:>10.2f}x {r['kiln/numpy']:>10.2f}x"
        )
    print("samples/second (higher is better); ratios > 1 mean kiln is faster; numpy: single-process loop by hand")

    record = {
        "benchmark": "data",
        "units": "samples per second (best epoch); ratios: kiln throughput / other throughput",
        "settings": {"samples": args.samples, "batch_size": args.batch_size, "repeat": args.repeat},
        "machine": {**machine_info(torch), "argv": sys.argv[1:]},
        "results": rows,
    }
    write_json_atomically(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
