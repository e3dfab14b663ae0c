"""``kiln.compile.config``: the compiler's settings (PyTorch keeps these in ``torch._dynamo.config``)."""

from __future__ import annotations

cache_size_limit: int = 8
"""How many traces one compiled function keeps (each for another set of guards) before it runs eagerly
whenever no trace's guards hold, with a warning; PyTorch's default is 8 as well."""

disabled: bool = False
"""True: every compiled function runs its original code (PyTorch's ``torch._dynamo.config.disable``, which
``TORCHDYNAMO_DISABLE=1`` sets; the environment variable ``KILN_COMPILE_DISABLE=1`` sets this at import)."""

accumulated_cache_size_limit: int = 256
"""How many traces one compiled function keeps in all, the other shapes of a kept trace included (which
``cache_size_limit`` does not count: see ``automatic_dynamic_shapes``); PyTorch's default is 256 as well."""

automatic_dynamic_shapes: bool = True
"""True: a compiled function with ``dynamic=None`` (the default) that meets a kept trace's program at other
shapes (the same ops on tensors of the same ranks; only sizes, strides and the int arguments of ops
differ) traces it again without counting it towards ``cache_size_limit``, and compiles it with kernels
that read the sizes that changed at run time, which its later shapes reuse (PyTorch's setting of the same
name). False: every new shape counts, and each trace's kernels are made for its shapes, as with
``dynamic=False``."""

suppress_errors: bool = False
"""True: a call whose trace the backend fails to compile runs eagerly, with a warning naming the error,
and so do that trace's later calls (PyTorch's setting of the same name); False: the call raises
:class:`kiln.compile.BackendCompilerFailed`."""
