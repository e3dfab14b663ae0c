"""The models of the training-step benchmarks (bench_cpu.py, bench_compile.py), written once for both libraries:
each function takes the ``nn`` namespace (``torch.nn`` or ``kiln.nn``) and builds the model from it."""

from __future__ import annotations


def mlp(nn):
    """A 784-256-10 ReLU MLP."""
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def cnn(nn):
    """Two 3x3 convolutions with ReLU and 2x2 max pooling, then a linear head, for 28x28 images."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )  # fmt: skip


# name, model builder, input shape, what the row says
STEPS = (
    ("MLP step", mlp, (128, 784), "784-256-10 ReLU MLP, batch 128"),
    ("CNN step", cnn, (64, 1, 28, 28), "2 conv + 2 pool + linear, batch 64 of 28x28"),
)


def sgd_steps(kiln, torch, make, shape, rng) -> tuple:
    """One SGD training step (forward, cross entropy, backward, step; lr 1e-3) of the same model in each
    library (``make(nn)`` builds it; kiln's weights are copied from PyTorch's) on the same random batch of
    ``shape`` with labels 0-9: ``(kiln_step, torch_step)``, each returning its loss before the update."""
    import kiln.nn

    t_model = make(torch.nn)
    k_model = make(kiln.nn)
    k_model.load_state_dict({k: kiln.from_numpy(v.detach().numpy().copy()) for k, v in t_model.state_dict().items()})
    x = rng.standard_normal(shape).astype("float32")
    y = rng.integers(0, 10, shape[0])

    def steps(lib, model):
        opt = lib.optim.SGD(model.parameters(), lr=1e-3)
        xs, ys = lib.from_numpy(x), lib.from_numpy(y)

        def step():
            opt.zero_grad()
            loss = lib.nn.functional.cross_entropy(model(xs), ys)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    return steps(kiln, k_model), steps(torch, t_model)
