"""The kiln distributions: those in this checkout (``packages/*/pyproject.toml``) and those planned.

A package in ``packages/`` must have a guide (``docs/guides/<distribution>.rst``) and its public
modules listed in :data:`PACKAGES`; :func:`problems` says what is missing and the docs build turns
each problem into a warning (an error under ``-W``), so a new package cannot land undocumented.
"""

from __future__ import annotations

import dataclasses
import tomllib

from kilndocs import DOCS, ROOT


@dataclasses.dataclass(frozen=True)
class Package:
    """One distribution of the kiln monorepo."""

    distribution: str
    imports: str  # what a user imports, as shown to readers
    summary: str
    modules: tuple[str, ...] = ()  # the public modules whose names the API reference documents


# Every distribution of the design (DESIGN.md §1), in reading order. The ones with a directory under
# packages/ are "available"; the rest are listed as planned and never documented as if they existed.
PACKAGES: tuple[Package, ...] = (
    Package(
        "kiln",
        "``kiln``",
        "The core: Tensor, dtypes, devices, the op dispatcher, autograd, the plugin manager, the NumPy "
        'reference backend for device ``"cpu"`` and the ``kiln`` command.',
        (
            "kiln",
            "kiln.autograd",
            "kiln.autograd.functional",
            "kiln.utils.checkpoint",
            "kiln.func",
            "kiln.jit",
            "kiln.fft",
            "kiln.special",
            "kiln.accelerator",
            "kiln.backends",
            "kiln.backends.cpu",
            "kiln.backends.cuda",
            "kiln.backends.cudnn",
            "kiln.backends.mkl",
            "kiln.backends.mkldnn",
            "kiln.backends.mps",
            "kiln.backends.openmp",
            "kiln.backends.opt_einsum",
            "kiln.multiprocessing",
            "kiln.utils.tensorboard",
            "kiln.distributions",
            "kiln.distributions.constraints",
            "kiln.distributions.constraint_registry",
            "kiln.distributions.kl",
            "kiln.distributions.transforms",
            "kiln.distributions.utils",
            "kiln.random",
            "kiln.futures",
            "kiln.sparse",
            "kiln.serialization",
            "kiln.hookspecs",
            "kiln.plugins",
            "kiln.backend",
        ),
    ),
    Package(
        "kiln-testing",
        "``kiln.testing``, pytest plugin ``kiln_testing``",
        "Testing helpers (``assert_close``, ``make_tensor``, gradient checks, Hypothesis strategies) and the "
        "conformance suite for backends: every registered op against the reference backend "
        "(``pytest --kiln-device=NAME``).",
        ("kiln.testing", "kiln.testing.strategies", "kiln_testing"),
    ),
    Package("kiln-cpu", "``kiln_cpu``", 'Numba JIT kernels for device ``"cpu"``.', ("kiln_cpu",)),
    Package(
        "kiln-cuda",
        "``kiln_cuda``, ``kiln.cuda``",
        'Device ``"cuda"``: a caching allocator, streams and events, and kernels generated for ``numba.cuda``, '
        "tested on its simulator.",
        ("kiln_cuda.api", "kiln_cuda.streams", "kiln_cuda.memory", "kiln_cuda.codegen"),
    ),
    Package(
        "kiln-nn",
        "``kiln.nn``, ``kiln.optim``",
        "Layers, ``kiln.nn.functional``, initialisers, optimizers and learning-rate schedulers.",
        (
            "kiln.nn",
            "kiln.nn.functional",
            "kiln.nn.init",
            "kiln.nn.utils",
            "kiln.nn.utils.rnn",
            "kiln.nn.utils.parametrize",
            "kiln.nn.utils.parametrizations",
            "kiln.nn.utils.fusion",
            "kiln.nn.utils.init",
            "kiln.nn.utils.memory_format",
            "kiln.nn.utils.prune",
            "kiln.nn.utils.stateless",
            "kiln.nn.parallel",
            "kiln.optim",
            "kiln.optim.lr_scheduler",
        ),
    ),
    Package(
        "kiln-data",
        "``kiln.data``",
        "Datasets, ``DataLoader``, samplers and transforms.",
        ("kiln.data", "kiln.data.datasets", "kiln.data.transforms"),
    ),
    Package(
        "kiln-amp",
        "``kiln.amp``",
        "Mixed precision: ``autocast`` (every device, the policy read from the op record) and ``GradScaler``.",
        ("kiln.amp",),
    ),
    Package(
        "kiln-distributed",
        "``kiln.distributed``, ``kiln-run``",
        "Process groups on Gloo and MPI, every collective, ``DistributedDataParallel``, "
        "``ZeroRedundancyOptimizer`` and the ``kiln-run`` launcher.",
        (
            "kiln.distributed",
            "kiln.distributed.ddp",
            "kiln.distributed.optim",
            "kiln.distributed.algorithms.ddp_comm_hooks.default_hooks",
            "kiln.distributed.run",
            "kiln.distributed.launcher",
        ),
    ),
    Package(
        "kiln-compile",
        "``kiln.compile``, ``kiln.compiler``, ``kiln._dynamo``, ``kiln.export``, ``kiln.onnx``",
        "``torch.compile``'s API: a guarded tracing compiler (forward and backward behind one autograd node, "
        "fused kernels from the device's code generator), programs that run with the core alone, ONNX export.",
        (
            "kiln.compile",
            "kiln.compiler",
            "kiln._dynamo",
            "kiln._dynamo.config",
            "kiln._dynamo.exc",
            "kiln.export",
            "kiln.onnx",
        ),
    ),
)


def in_checkout() -> dict[str, str]:
    """Distribution name -> its directory under ``packages/``, for every package in this checkout."""
    found = {}
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        with pyproject.open("rb") as f:
            name = tomllib.load(f).get("project", {}).get("name")
        if name:
            found[name] = pyproject.parent.name
    return found


def available() -> list[Package]:
    """The packages of :data:`PACKAGES` that exist in this checkout, in reading order."""
    here = in_checkout()
    return [p for p in PACKAGES if p.distribution in here]


def planned() -> list[Package]:
    """The packages of the design that do not exist yet."""
    here = in_checkout()
    return [p for p in PACKAGES if p.distribution not in here]


def guide(distribution: str) -> str:
    """The docname of a package's guide."""
    return f"guides/{distribution}"


def problems() -> list[str]:
    """Why the docs do not cover every package in this checkout (empty when they do)."""
    out = []
    known = {p.distribution: p for p in PACKAGES}
    for dist, directory in in_checkout().items():
        if dist not in known:
            out.append(
                f"packages/{directory} ({dist}) is not in kilndocs.packages.PACKAGES: add it, with its public modules"
            )
        if not (DOCS / f"{guide(dist)}.rst").exists():
            out.append(f"packages/{directory} ({dist}) has no guide: write docs/{guide(dist)}.rst")
    return out
