"""Train a small MLP on a synthetic two-class spiral, using only the kiln core.

This is the demo job (``nox -s demo``). It makes the data with kiln's random functions, writes the
network as plain tensors with ``requires_grad=True``, computes a softmax cross-entropy loss from
elementwise ops and reductions, lets autograd produce the gradients, and updates the parameters with
SGD + momentum under ``kiln.no_grad()``. Once kiln-nn and kiln-data exist, the same loop shrinks to
``nn.Sequential``, ``optim.SGD`` and a ``DataLoader``.

    python docs/examples/train_synthetic.py [--epochs N] [--lr LR] [--seed S]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time

import kiln


def make_spiral(n: int, noise: float = 0.05, turns: float = 1.5) -> tuple[kiln.Tensor, kiln.Tensor]:
    """``n`` points on two interleaved spiral arms: float32 inputs (n, 2) and int64 labels (n,)."""
    labels = kiln.randint(0, 2, (n,))  # random labels, so the samples come already shuffled
    radius = kiln.rand(n).sqrt()  # uniform over the disc's area rather than along the arm
    theta = radius * (2 * math.pi * turns) + labels.float() * math.pi  # arm 1 is arm 0 turned by pi
    # (cos θ, sin θ) in one broadcast op: sin θ = cos(θ - π/2)
    xy = (theta.unsqueeze(1) - kiln.tensor([0.0, math.pi / 2])).cos()
    return radius.unsqueeze(1) * xy + noise * kiln.randn(n, 2), labels


def init_mlp(sizes: list[int]) -> list[kiln.Tensor]:
    """Weights (He-normal) and zero biases of an MLP with layer widths ``sizes``, as leaf tensors."""
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        params.append((kiln.randn(fan_in, fan_out) * math.sqrt(2.0 / fan_in)).requires_grad_())
        params.append(kiln.zeros(fan_out, requires_grad=True))
    return params


def forward(params: list[kiln.Tensor], x: kiln.Tensor) -> kiln.Tensor:
    """Logits of the MLP: ReLU between the affine layers, none after the last."""
    layers = list(zip(params[0::2], params[1::2]))
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if i < len(layers) - 1:
            x = x.relu()
    return x


def cross_entropy(logits: kiln.Tensor, target: kiln.Tensor) -> kiln.Tensor:
    """Mean softmax cross-entropy, with a numerically stable log-sum-exp (no log_softmax in the core yet)."""
    m = logits.amax(dim=1, keepdim=True).detach()
    log_probs = logits - m - (logits - m).exp().sum(dim=1, keepdim=True).log()
    one_hot = (target.unsqueeze(1) == kiln.arange(logits.shape[1]).unsqueeze(0)).float()
    return -(one_hot * log_probs).sum(dim=1).mean()


def accuracy(logits: kiln.Tensor, target: kiln.Tensor) -> float:
    """Fraction of rows whose largest logit is the target class."""
    return (logits.argmax(dim=1) == target).float().mean().item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="passes over the training set (default 20)")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    parser.add_argument("--batch-size", type=int, default=32, help="minibatch size (default 32)")
    parser.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers (default 64)")
    parser.add_argument("--samples", type=int, default=1024, help="training points (default 1024)")
    parser.add_argument("--seed", type=int, default=0, help="seed for kiln.manual_seed (default 0)")
    args = parser.parse_args(argv)

    kiln.manual_seed(args.seed)
    x_train, y_train = make_spiral(args.samples)
    x_test, y_test = make_spiral(args.samples // 4)
    params = init_mlp([2, args.hidden, args.hidden, 2])
    velocity = [kiln.zeros_like(p) for p in params]
    print(f"kiln {kiln.__version__}: MLP 2-{args.hidden}-{args.hidden}-2 on {args.samples} spiral points")

    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        total, seen = 0.0, 0
        for lo in range(0, args.samples, args.batch_size):
            xb, yb = x_train[lo : lo + args.batch_size], y_train[lo : lo + args.batch_size]
            loss = cross_entropy(forward(params, xb), yb)
            loss.backward()
            with kiln.no_grad():
                for p, v in zip(params, velocity):
                    v.mul_(args.momentum).add_(p.grad)
                    p.sub_(args.lr * v)
                    p.grad = None
            total += loss.item() * xb.shape[0]
            seen += xb.shape[0]
        with kiln.no_grad():
            train_acc = accuracy(forward(params, x_train), y_train)
        print(f"epoch {epoch:3d}/{args.epochs}  loss {total / seen:.4f}  train accuracy {train_acc:.3f}")

    with kiln.no_grad():
        test_acc = accuracy(forward(params, x_test), y_test)
    print(f"final test accuracy {test_acc:.3f} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
