"""The hooks a kiln plugin implements (entry-point group ``kiln``).

Each hook receives a ``register`` callback; a plugin calls it once per thing it provides. Hooks run
once, lazily, the first time kiln needs a device, kernel or extension, never at ``import kiln``.
A plugin module implements any subset of them as plain functions decorated with ``kiln.hookimpl``.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("kiln")
hookimpl = pluggy.HookimplMarker("kiln")


@hookspec
def kiln_register_devices(register):
    """Register device types: ``register(name, *, empty, to_host, from_host, write, ...)``."""


@hookspec
def kiln_register_kernels(register):
    """Register kernels: ``register(op_name, device_type, kernel, dtypes=None)`` (``dtypes``: output dtypes).

    ``register(op_name, device_type, kernel, dtypes=None, inplace=True)`` registers the kernel of the op's
    in-place variant (``add_`` for ``add``): ``kernel(spec, self, *args)`` writes the op's result into
    ``self`` and returns it, or returns None, having written nothing, where it does not take the call. The
    core calls it only where nothing is recorded (no autograd history, no dispatch mode), the result has
    ``self``'s shape and dtype (``spec``), and the same plugin's kernel runs the op for that dtype; it must
    give the values of that kernel followed by a copy, also where an argument shares memory with ``self``
    (``kiln.backend.reference_kernel(name, inplace=True)``: the reference's, to fall back on). Otherwise,
    and where the kernel declines, the core computes out of place and copies."""


@hookspec
def kiln_register_modes(register):
    """Register dispatch modes (autocast, tracing, profiling): ``register(name, mode_class)``.

    ``mode_class`` is a :class:`kiln.backend.DispatchMode` subclass made with no arguments. The core reads
    ``"autocast"``: ``kiln.autocast`` regions push one instance per thread, and call its ``clear_cache()``
    when the outermost region exits (kiln-amp registers it).
    """


@hookspec
def kiln_register_collectives(register):
    """Register process-group backends (gloo, mpi, nccl, ...): ``register(name, engine_class)``.

    ``engine_class`` subclasses ``kiln.distributed.engine.Engine`` (kiln-distributed): made as
    ``engine_class(store, rank, world_size, timeout, group_ranks)`` for each process group that uses
    ``name``, it runs the collectives on tensors of the device types in its ``devices`` attribute.
    ``kiln.plugins.collectives()`` lists what is registered.
    """


@hookspec
def kiln_register_compilers(register):
    """Register compiler backends and device code generators: ``register(name, compiler)``.

    A **backend** is what ``kiln.compile(..., backend=name)`` selects (kiln-compile registers ``"kiln"``,
    ``"eager"`` and ``"debug"``): a callable ``backend(graph, example_inputs) -> callable`` that receives a
    traced ``kiln.compile.Graph`` and returns the function to run in its place, as PyTorch's custom backends
    do. A **device code generator** is a callable with a ``device_type`` attribute: the ``"kiln"`` backend
    calls ``lower(graph, names)`` for graphs on that device type, and it returns the nodes it replaces with
    fused kernels (see kiln-compile's guide). ``kiln.plugins.compilers()`` lists what is registered.
    """


@hookspec
def kiln_register_threading(register):
    """Register a backend's intra-op thread control: ``register(name, set_num_threads=fn, get_num_threads=fn)``.

    ``kiln.set_num_threads(n)`` calls every registered setter; ``kiln.get_num_threads()`` asks the first
    registered getter."""


@hookspec
def kiln_register_fused_updates(register):
    """Register fused optimizer updates: ``register(name, device_type, fn)``.

    ``name`` is a ``kiln.optim`` algorithm (``"sgd"``, ``"adam"``...). ``fn`` has the signature of
    kiln.optim's update rule for that algorithm (parallel lists of parameters, gradients and state,
    hyper-parameters as keywords) and updates the tensors in place, with the rule's results. It returns
    ``False`` to decline a call, having changed nothing (kiln.optim then runs its own loop); any other
    return value means the update is done."""


@hookspec
def kiln_register_extensions(register):
    """Announce a feature package: ``register(name, version, **info)``."""
