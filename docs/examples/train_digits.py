"""Train a small CNN on the 8x8 handwritten digits with kiln, kiln-nn and kiln-data.

This is the demo job (``nox -s demo``) and reads like its PyTorch twin: ``import kiln`` where PyTorch
code has ``import torch``, ``kiln.nn`` for ``torch.nn``, ``kiln.data`` for ``torch.utils.data``. The
data set is embedded in kiln-data (no download). The script trains with Adam, shows a progress bar per
epoch, keeps the best checkpoint (safetensors), reloads it into a fresh model to check it, and writes
a PNG with the training curves and the test images the model gets wrong. ``--amp`` trains in mixed
precision with kiln-amp, as PyTorch code does with ``torch.autocast`` and ``torch.amp.GradScaler``;
``--compile`` trains the model through ``kiln.compile`` (kiln-compile), as ``torch.compile(model)``.

    python docs/examples/train_digits.py [--epochs N] [--batch-size B] [--device D] [--workers W]
                                         [--out DIR] [--resume CHECKPOINT] [--seed S] [--amp] [--compile]

The same script trains on several processes with kiln-distributed, as with PyTorch's torchrun:

    kiln-run --nproc-per-node 2 docs/examples/train_digits.py [options as above]

Started by a launcher with ``WORLD_SIZE`` > 1 it joins a process group (``init_process_group("gloo")``,
cpu only), wraps the model in ``DistributedDataParallel`` and gives each rank its share of the training
set (``DistributedSampler``, reshuffled each epoch with ``set_epoch``). ``--batch-size`` stays the global
batch: each rank takes ``batch-size / WORLD_SIZE`` samples per step and DDP averages the gradients, so a
step sees the same number of samples as in one process and the accuracy is the same. Rank 0 alone shows
the progress, evaluates, writes the checkpoints and the PNG; the other ranks wait for it and exit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import matplotlib
import matplotlib.pyplot as plt
from tqdm import tqdm

import kiln
import kiln.nn as nn
from kiln.data import DataLoader, DistributedSampler, random_split
from kiln.data.datasets import Digits

matplotlib.use("Agg")  # draw into files only: no window, no display needed


def make_model() -> nn.Module:
    """Two 3x3 convolutions (16 and 32 channels), one 2x2 max pool, a linear head: 10 logits."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),  # (N, 16, 8, 8)
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),  # (N, 32, 8, 8)
        nn.MaxPool2d(2), nn.Flatten(),  # (N, 32 * 4 * 4)
        nn.Dropout(0.25), nn.Linear(32 * 4 * 4, 10),
    )  # fmt: skip


def evaluate(model: nn.Module, loader: DataLoader, device: kiln.device):
    """Accuracy on ``loader`` and the misclassified samples as (image, label, prediction) arrays."""
    model.eval()  # Dropout off
    correct, seen, mistakes = 0, 0, []
    with kiln.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            preds = model(images).argmax(dim=1)
            wrong = preds != labels
            correct += int((~wrong).sum().item())
            seen += labels.shape[0]
            if wrong.any().item():  # boolean indexing as in PyTorch; .numpy() needs a CPU tensor
                mistakes += zip(images[wrong].cpu().numpy(), labels[wrong].tolist(), preds[wrong].tolist())
    return correct / seen, mistakes


def plot(history: dict, mistakes: list, path: str) -> None:
    """Loss and accuracy per epoch on the left, up to 24 misclassified test images on the right."""
    fig = plt.figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[1, 1.2])
    ax_loss, ax_acc = left.subplots(2, 1, sharex=True)
    epochs = range(1, len(history["loss"]) + 1)
    ax_loss.plot(epochs, history["loss"], marker="o")
    ax_loss.set_ylabel("train loss")
    ax_acc.plot(epochs, [100 * a for a in history["accuracy"]], marker="o", color="tab:green")
    ax_acc.set(xlabel="epoch", ylabel="test accuracy (%)")
    right.suptitle(f"misclassified test images ({len(mistakes)}): prediction / label")
    for ax, (image, label, pred) in zip(right.subplots(4, 6).flat, mistakes + [(None, None, None)] * 24):
        ax.axis("off")
        if image is not None:
            ax.imshow(image[0], cmap="gray_r", vmin=0, vmax=1)
            ax.set_title(f"{pred} / {label}", fontsize=9, color="tab:red")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def launched_world_size() -> int:
    """The number of processes a launcher (kiln-run, torchrun) started for this job: 1 when run alone."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    world_size = launched_world_size()
    # kiln.cuda exists even without kiln-cuda installed; it then reports no GPU, as torch.cuda does.
    # Several processes communicate through gloo, which moves cpu tensors: they train on the cpu.
    default_device = "cuda" if kiln.cuda.is_available() and world_size == 1 else "cpu"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10, help="train until this epoch (default 10)")
    p.add_argument("--batch-size", type=int, default=32, help="minibatch size (default 32)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    p.add_argument("--device", default=default_device, help=f"device to train on (default {default_device})")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    p.add_argument("--out", default="runs/digits", help="output directory (default runs/digits)")
    p.add_argument("--resume", metavar="CHECKPOINT", help="continue from a last.safetensors of an earlier run")
    p.add_argument("--seed", type=int, default=0, help="seed for initialisation and shuffling (default 0)")
    p.add_argument(
        "--amp",
        action="store_true",
        help="mixed precision: autocast (bfloat16 on cpu, float16 elsewhere; needs kiln-amp)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="train the model through kiln.compile (forward and backward compiled; needs kiln-compile)",
    )
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "workers"):
        if getattr(args, name) < (0 if name == "workers" else 1):
            p.error(f"--{name.replace('_', '-')} must be {'>= 0' if name == 'workers' else '>= 1'}")
    if args.batch_size % world_size:
        p.error(f"--batch-size {args.batch_size}: must be a multiple of the {world_size} processes (WORLD_SIZE)")
    try:  # an unknown device type is an error at the first allocation, with a message naming the fix
        kiln.empty(0, device=args.device)
    except (RuntimeError, ValueError) as e:
        p.error(f"--device {args.device}: {e}")
    if world_size > 1 and kiln.device(args.device).type != "cpu":
        p.error(f"--device {args.device}: a run on {world_size} processes trains on the cpu (gloo)")
    if args.amp:
        try:  # kiln.autocast is always there; it says which package to install when kiln-amp is not
            kiln.autocast(kiln.device(args.device).type)
        except (ModuleNotFoundError, RuntimeError) as e:
            p.error(f"--amp: {e}")
    if args.compile:
        try:  # kiln.compile is always there; it says which package to install when kiln-compile is not
            kiln.compile.list_backends()
        except (ModuleNotFoundError, AttributeError) as e:
            p.error(f"--compile: {e}")
    if args.resume and not os.path.isfile(args.resume):
        p.error(f"--resume {args.resume}: no such file")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = kiln.device(args.device)
    distributed = launched_world_size() > 1
    if distributed:  # started by kiln-run (or torchrun): RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are set
        import kiln.distributed as dist  # kiln-distributed, as torch.distributed
        from kiln.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    is_main = rank == 0  # rank 0 alone prints, evaluates and writes files
    kiln.manual_seed(args.seed)  # weights and Dropout

    # A fixed 80/20 split, whatever --seed says: the test set is the same in every run.
    train_set, test_set = random_split(Digits(), [0.8, 0.2], generator=kiln.Generator().manual_seed(0))
    shuffle = kiln.Generator().manual_seed(args.seed)
    if distributed:
        # Each rank a disjoint share of every epoch's shuffled order, and batch-size / world_size samples a
        # step: the gradients DDP averages are those of one batch of --batch-size, as in one process.
        sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
        train_loader = DataLoader(
            train_set, batch_size=args.batch_size // world_size, sampler=sampler, num_workers=args.workers
        )
    else:
        sampler = None
        train_loader = DataLoader(
            train_set, batch_size=args.batch_size, shuffle=True, generator=shuffle, num_workers=args.workers
        )
    test_loader = DataLoader(test_set, batch_size=256, num_workers=args.workers)

    model = make_model().to(device)
    optimizer = kiln.optim.Adam(model.parameters(), lr=args.lr)  # kiln.optim is torch.optim
    loss_fn = nn.CrossEntropyLoss()
    # Mixed precision as in PyTorch: autocast around the forward pass and the loss; a GradScaler keeps
    # float16 gradients from underflowing (bfloat16 has float32's range and needs none: enabled=False
    # makes every scaler call a pass-through).
    autocast = kiln.autocast(device.type, enabled=args.amp)
    if args.amp:
        scaler = kiln.amp.GradScaler(device.type, enabled=autocast.fast_dtype is kiln.float16)
    else:
        scaler = None
    history, best_acc, start = {"loss": [], "accuracy": []}, -1.0, 1
    if args.resume:
        # kiln.load never unpickles: a checkpoint is safetensors plus a JSON description of the nesting.
        # Load to the CPU: load_state_dict copies onto the parameters' device, and RNG states live there.
        ckpt = kiln.load(args.resume, map_location="cpu")
        if not isinstance(ckpt, dict) or "optimizer" not in ckpt:
            sys.exit(f"error: --resume {args.resume}: not a training checkpoint (use a last.safetensors)")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        kiln.set_rng_state(ckpt["rng"]["global"])  # so a resumed run continues exactly as an unbroken one
        shuffle.set_state(ckpt["rng"]["shuffle"])
        history, best_acc, start = ckpt["history"], ckpt["best_accuracy"], ckpt["epoch"] + 1
    # net trains; model (the same parameters) is what is evaluated and saved, so a checkpoint loads either way.
    net = model
    if distributed:
        # DDP broadcasts rank 0's weights to every rank, then averages the gradients during backward.
        net = DDP(model)
        if rank > 0:  # Dropout masks of its own on each rank (rank 0 keeps a single process's stream)
            kiln.manual_seed(args.seed + 1_000_003 * rank + start)
    if args.compile:  # as torch.compile: the first batches trace (and each new batch shape), later ones replay
        net = kiln.compile(net)

    best_path, last_path = os.path.join(args.out, "best.safetensors"), os.path.join(args.out, "last.safetensors")
    png_path = os.path.join(args.out, "digits.png")
    if is_main:
        os.makedirs(args.out, exist_ok=True)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"kiln {kiln.__version__} on {device}: digits {len(train_set)} train / {len(test_set)} test images")
        precision = f"autocast {autocast.fast_dtype}" if args.amp else "float32"
        precision += ", kiln.compile" if args.compile else ""
        print(
            f"CNN with {n_params:,} parameters, Adam lr {args.lr}, batch {args.batch_size}, seed {args.seed}, "
            f"{precision}"
        )
        if distributed:
            print(f"{world_size} processes (gloo): DistributedDataParallel, {args.batch_size // world_size} per rank")
        if args.resume:
            print(f"resumed from {args.resume} after epoch {start - 1} (best accuracy so far {best_acc:.2%})")

    no_bar = None if is_main else True  # a progress bar on rank 0 only
    t0 = time.perf_counter()
    for epoch in range(start, args.epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same permutation on every rank
        net.train()
        total, seen = 0.0, 0
        # disable=None: a live bar on a terminal, no carriage-return clutter in logs and CI output
        bar = tqdm(train_loader, desc=f"epoch {epoch}/{args.epochs}", unit="batch", leave=False, disable=no_bar)
        for images, labels in bar:
            images, labels = images.to(device), labels.to(device)
            with autocast:
                loss = loss_fn(net(images), labels)
            optimizer.zero_grad()
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)  # skipped when a gradient overflowed
                scaler.update()
            total += loss.item() * labels.shape[0]
            seen += labels.shape[0]
            bar.set_postfix(loss=f"{total / seen:.4f}")
        if distributed:  # the loss over the whole training set: every rank's sums added up
            sums = kiln.tensor([total, seen], dtype=kiln.float64)
            dist.all_reduce(sums)
            total, seen = sums.tolist()
        if not is_main:
            continue  # on to the next epoch: its first all-reduce waits while rank 0 evaluates and saves
        accuracy, _ = evaluate(model, test_loader, device)
        history["loss"].append(total / seen)
        history["accuracy"].append(accuracy)
        note = ""
        if accuracy > best_acc:  # (a real project would choose on a validation split, not the test set)
            best_acc, note = accuracy, "  * best, saved"
            kiln.save(model.state_dict(), best_path)  # safetensors, written atomically (temp file + rename)
        # Everything needed to resume, in one file: int dict keys, lists and floats are fine in kiln.save.
        rng = {"global": kiln.get_rng_state(), "shuffle": shuffle.get_state()}
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "rng": rng}
        if scaler is not None:
            state["scaler"] = scaler.state_dict()
        kiln.save({**state, "history": history, "best_accuracy": best_acc}, last_path)
        print(f"epoch {epoch:2d}/{args.epochs}  train loss {total / seen:.4f}  test accuracy {accuracy:.2%}{note}")
    train_seconds = time.perf_counter() - t0

    status = 0
    if is_main:
        if not os.path.isfile(best_path):
            sys.exit(f"error: no checkpoint at {best_path}: nothing was trained")
        # Reload the best weights into a fresh model: the accuracy must be the one recorded above.
        fresh = make_model().to(device)
        fresh.load_state_dict(kiln.load(best_path, map_location=device))
        reloaded_acc, mistakes = evaluate(fresh, test_loader, device)
        plot(history, mistakes, png_path)

        print(f"training time {train_seconds:.1f} s for {max(0, args.epochs - start + 1)} epochs")
        print(f"best checkpoint reloaded: test accuracy {reloaded_acc:.2%} ({len(mistakes)} of {len(test_set)} wrong)")
        print(f"wrote {best_path}\n      {last_path}\n      {png_path}")
        if abs(reloaded_acc - best_acc) > 1e-9:
            print(f"error: the reloaded model scores {reloaded_acc:.2%}, the saved one {best_acc:.2%}", file=sys.stderr)
            status = 1
    if distributed:
        dist.barrier()  # the other ranks wait here until rank 0 has checked the checkpoint and drawn the PNG
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
