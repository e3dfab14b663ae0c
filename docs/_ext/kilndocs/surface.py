"""The PyTorch API surface and kiln's coverage of it, namespace by namespace, with PyTorch as the oracle.

For each namespace of :data:`NAMESPACES` (``torch``, ``torch.Tensor``, ``torch.nn``, ...), every public
name PyTorch has is looked up in kiln's counterpart (``kiln``, ``kiln.Tensor``, ``kiln.nn``, ...) and
classified:

* ``ok``: kiln has it, and its signature matches PyTorch's where both can be read: the same parameter
  names in the same order, the same kinds (positional-only, keyword-only, ``*args``) and the same
  defaults; kiln may add parameters of its own after PyTorch's, with defaults, and may accept by
  position a parameter one of PyTorch's overloads takes by keyword only (one kiln signature serves
  ``std(input, dim, unbiased, keepdim)`` and ``std(input, dim, *, correction, keepdim)``);
* ``differs``: kiln has it with another signature (the difference is shown);
* ``left out``: kiln leaves it out on purpose, for the reason :data:`LEFT_OUT` gives; this list is the one
  place where left-out names and their reasons are kept;
* ``missing``: neither.

PyTorch's signature comes from ``inspect.signature`` or, for its C++ builtins, from the first lines of
the docstring (``add(input, other, *, alpha=1, out=None) -> Tensor``; every overload it lists counts).

``tests-integration/test_api_surface.py`` runs :func:`survey` and fails on a missing name; the docs page
``api-coverage`` renders it (:func:`render`). Both need PyTorch installed (a test and docs dependency,
never a runtime one).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import types
from typing import Any

# (PyTorch namespace, kiln namespace); "X.Tensor" means the attributes of the Tensor class
NAMESPACES: tuple[tuple[str, str], ...] = (
    ("torch", "kiln"),
    ("torch.Tensor", "kiln.Tensor"),
    ("torch.nn", "kiln.nn"),
    ("torch.nn.functional", "kiln.nn.functional"),
    ("torch.nn.init", "kiln.nn.init"),
    ("torch.nn.utils", "kiln.nn.utils"),
    ("torch.optim", "kiln.optim"),
    ("torch.optim.lr_scheduler", "kiln.optim.lr_scheduler"),
    ("torch.utils.data", "kiln.utils.data"),
    ("torch.autograd", "kiln.autograd"),
    ("torch.linalg", "kiln.linalg"),
    ("torch.fft", "kiln.fft"),
    ("torch.special", "kiln.special"),
    ("torch.distributions", "kiln.distributions"),
)

_COMPLEX = "kiln has no complex dtypes yet (the transforms and views that make or take complex tensors wait for them)"
_QUANT = "quantized tensors and dtypes are not part of kiln (no quantization backend)"
_JIT = "TorchScript's C++ IR, compiler and runtime types: kiln compiles through kiln-compile, not TorchScript"
_LIB = (
    "an entry point into one vendor library's kernels (cuDNN, MIOpen, oneDNN, FBGEMM) or an internal ATen "
    "op PyTorch exports by accident; kiln's public op runs its own kernels"
)
_SYM = "symbolic shapes belong to PyTorch's tracing compiler (torch.compile); kiln-compile traces concrete shapes"
_SPARSE = "sparse layouts other than COO (CSR, CSC, BSR, BSC) are not built; COO covers graph-network use"
_DTYPES = (
    "dtypes kiln does not have (float8, sub-byte, unsigned 16-64-bit, complex): kiln's dtypes are the ten of the design"
)
_STORAGE = "kiln has no user-visible typed storage objects: a tensor's storage is its device's buffer"
_DATAPIPES = "torchdata's DataPipes were removed from PyTorch's roadmap; kiln.data keeps the Dataset/DataLoader API"
_DISTRIBUTED = "kiln-distributed provides it (kiln.distributed)"
_ACCEL = "needs a real accelerator device and streams (kiln-cuda's kiln.cuda provides streams and events)"
_VMAP = "vmap needs batching rules on the op record, which kiln does not have (a Python loop would not be vmap)"
_ATEN_NN = (
    "the ATen-level form of a torch.nn.functional function (integer reduction codes, cuDNN switches as "
    "arguments), which PyTorch exports by accident of its bindings; kiln.nn.functional has the Python API"
)
_COND = (
    "torch.cond is the control-flow operator of torch.export's symbolic tracing; kiln.export traces one path on "
    "concrete shapes (a branch on a value is a guard in kiln.compile, an error in kiln.export)"
)
_HOUSEHOLDER = (
    "LAPACK's raw Householder QR pieces are not exposed; kiln.linalg.qr and kiln.linalg.householder_product "
    "cover their uses"
)
_LOBPCG = "LOBPCG, an iterative eigensolver for large sparse problems, is not built"

# (regular expression on "namespace:name", reason); the first match wins
LEFT_OUT: tuple[tuple[str, str], ...] = (
    (r"torch\.fft:(i?r?h?fft[2n]?|i?fft[2n]?|i?h?fft[2n]?)$", _COMPLEX),
    (
        r"torch(\.Tensor)?:(complex.*|c(float|double|half)|chalf|view_as_(real|complex)(_copy)?|polar|angle|"
        r"conj(_physical_?)?|is_conj|is_neg|real|imag|adjoint|mH|H|istft|stft)$",
        _COMPLEX,
    ),
    (r"torch\.linalg:(eig|eigvals)$", _COMPLEX),
    (
        r"torch(\.Tensor)?:(q_.*|quantize_.*|dequantize|(?!n?anquantile|quantile|is_quantized).*quant.*|qint.*|quint.*|int_repr|qscheme|"
        r"fake_quantize_.*|fbgemm_.*|choose_qparams.*|empty_quantized)$",
        _QUANT,
    ),
    (
        r"torch:([A-Z]\w*(Type|Iterator|Property|Function|Builder|Context|Stats|Config|Logger|Schema|Guard|State)|"
        r"Script\w*|Graph\w*|Node|Value|Block|Use|Code|Argument|ArgumentSpec|CompleteArgumentSpec|AliasDb|"
        r"CompilationUnit|ConcreteModuleType.*|DeepCopyMemoTable|ErrorReport|ExecutionPlan|FileCheck|Gradient|"
        r"IODescriptor|JITException|LiteScriptModule|LockingLogger|NoopLogger|OperatorInfo|PyTorchFile\w+|"
        r"StaticModule|ThroughputBenchmark|TracingState|CallStack|Capsule|Future|Type|AggregationType|AVG|SUM|"
        r"import_ir_module.*|parse_ir|parse_schema|parse_type_comment|merge_type_from_type_comment|"
        r"unify_type_list|wait|fork|DispatchKey\w*|DisableTorchFunction\w*|ExcludeDispatchKeyGuard|Tag|"
        r"BufferDict|ModuleDict|ParameterDict|BenchmarkConfig|BenchmarkExecutionStats|FatalError)$",
        _JIT,
    ),
    (
        r"torch(\.Tensor)?:(cudnn_.*|miopen_.*|mkldnn_.*|native_.*|.*_backward.*|batch_norm_(elemt|stats|"
        r"gather_stats.*|update_stats|backward_.*)|fused_.*|_?grid_sampler.*|affine_grid_generator|"
        r"embedding_renorm_|norm_except_dim|frobenius_norm|nuclear_norm|"
        r"quantized_.*|saddmm|smm|dsmm|hsmm|hspmm|sspaddmm|conv_tbc|to_mkldnn|"
        r"hash_tensor|nonzero_static|slice_inverse|sym_constrain_range.*|"
        r"resize_as_sparse_|sparse_resize_.*|record_stream|dim_order|is_set_to|set_)$",
        _LIB,
    ),
    (r"torch:(sym_.*|Sym(Int|Float|Bool))$", _SYM),
    (
        r"torch(\.Tensor)?:(sparse_(csr|csc|bsr|bsc|compressed)_tensor|(c?col|c?row|crow|ccol)_indices(_copy)?|"
        r"to_sparse_(csr|csc|bsr|bsc)|is_sparse_csr|sparse_mask)$",
        _SPARSE,
    ),
    (
        r"torch:(float8_.*|float4_.*|u?int[1-7]|uint(16|32|64)|bits\w*|bit|complex(32|64|128)|chalf|cfloat|cdouble)$",
        _DTYPES,
    ),
    (r"torch(\.Tensor)?:(\w*Storage|storage|storage_type|is_storage|from_file)$", _STORAGE),
    (
        r"torch\.utils\.data:(\w*DataPipe|DataChunk|functional_datapipe|guaranteed_datapipes_determinism|"
        r"non_deterministic|runtime_validation.*|argument_validation|_DatasetKind)$",
        _DATAPIPES,
    ),
    (r"torch\.nn:(SyncBatchNorm)$", _DISTRIBUTED),
    (
        r"torch\.nn\.functional:(BroadcastingList[123]|boolean_dispatch|assert_int_or_pair|has_torch_function\w*|"
        r"handle_torch_function)$",
        "PyTorch's internal plumbing for TorchScript typing and __torch_function__, exported by accident: not API",
    ),
    (
        r"torch\.nn\.functional:(grouped_mm|scaled_mm|scaled_grouped_mm|ScalingType|SwizzleType)$",
        "float8 and grouped GEMMs for GPU tensor cores (PyTorch runs them only on CUDA): for kiln-cuda",
    ),
    (
        r"torch\.nn\.functional:(conv_tbc)$",
        "an ATen-internal convolution layout (time, batch, channel) with no "
        "Python-level documentation; conv1d covers it",
    ),
    (r"torch\.autograd:(NestedIOFunction)$", "a legacy internal base class of PyTorch's old-style autograd functions"),
    (r"torch:(vmap)$", _VMAP),
    (r"torch\.Tensor:(eig)$", _COMPLEX),
    (
        r"torch\.Tensor:(lstsq|solve|symeig|name|reinforce|volatile)$",
        "removed from PyTorch: the attribute is left there only to raise an error pointing to the replacement",
    ),
    (r"torch\.Tensor:(as_subclass)$", "tensor subclasses through __torch_function__ are not supported"),
    (r"torch\.Tensor:(index)$", "first-class dimensions (functorch.dim) are not part of kiln"),
    (r"torch\.Tensor:(to_padded_tensor)$", "nested (jagged) tensors are not part of kiln"),
    (
        r"torch:(batch_norm|bilinear|binary_cross_entropy_with_logits|channel_shuffle|cosine_embedding_loss|"
        r"ctc_loss|embedding_bag|hinge_embedding_loss|instance_norm|kl_div|margin_ranking_loss|poisson_nll_loss|"
        r"triplet_margin_loss)$",
        _ATEN_NN,
    ),
    (r"torch:cond$", _COND),
    (r"torch(\.Tensor)?:(geqrf|orgqr|ormqr)$", _HOUSEHOLDER),
    (r"torch:(lobpcg)$", _LOBPCG),
    (
        r"torch:(indices_copy|values_copy)$",
        "functionalization's copies of sparse accessors; PyTorch itself cannot run them on a sparse tensor",
    ),
    (r"torch(\.Tensor)?:(Stream|Event|StreamObjType|AcceleratorError|OutOfMemoryError)$", _ACCEL),
)

_ABSENT = object()
_SPLIT_NAMES = (
    "PyTorch's Tensor method documents split_size_or_sections (its overloads: sections, indices); its function, "
    "and kiln's both, take indices_or_sections"
)
# "namespace:name" -> why kiln's signature differs from what the survey reads for PyTorch, where the
# difference is deliberate or PyTorch's own spellings disagree; the rows stay "differs" on the page
SIGNATURE_NOTES: dict[str, str] = {
    "torch:nan_to_num_": "PyTorch's Tensor method documents nan=0.0 and its ATen schema nan=None; kiln takes 0.0",
    "torch:randint_like": (
        "PyTorch's two overloads, (input, high) and (input, low, high), are one kiln signature with low first: "
        "randint_like(x, 10) draws from [0, 10) in both"
    ),
    "torch:rrelu": (
        "kiln.rrelu is nn.functional.rrelu (inplace at position 4) with generator as a keyword; PyTorch's "
        "top-level ATen form has generator at position 4"
    ),
    "torch:searchsorted": (
        "PyTorch documents the second parameter as values, but its binding names it input "
        "(searchsorted(s, values=v) fails there); kiln follows the binding"
    ),
    "torch.Tensor:hsplit": _SPLIT_NAMES,
    "torch.Tensor:vsplit": _SPLIT_NAMES,
    "torch.Tensor:dsplit": _SPLIT_NAMES,
    "torch.Tensor:uniform_": "from is a Python keyword, so kiln's parameter is from_ (as PyTorch's own Python code names it)",
    "torch.Tensor:new_empty_strided": (
        "PyTorch documents dtype, device ... as positional, but its binding takes them by keyword only, as kiln does"
    ),
    "torch.nn.functional:gelu": (
        "PyTorch documents approximate as positional, but its binding takes it by keyword only, as kiln does"
    ),
    "torch.utils.data:random_split": "generator=None means the default generator, which PyTorch writes as its default",
    "torch:tril_indices": "device=None means kiln's default device (PyTorch documents device='cpu')",
    "torch:triu_indices": "device=None means kiln's default device (PyTorch documents device='cpu')",
}
_NOT_API = (str, dict)  # docs fragments PyTorch keeps as module attributes (reproducibility_notes, ...)
_FOREIGN = ("typing", "collections.abc", "builtins", "abc", "enum", "functools", "warnings", "math")


@dataclasses.dataclass
class Row:
    """One PyTorch name and what kiln has for it."""

    name: str
    status: str  # "ok", "differs", "left out", "missing"
    detail: str = ""


def _resolve(path: str) -> Any:
    """The module or the Tensor class a namespace path names."""
    if path.endswith(".Tensor"):
        return importlib.import_module(path[: -len(".Tensor")]).Tensor
    return importlib.import_module(path)


def torch_names(ns: str) -> dict[str, Any]:
    """PyTorch's public names in namespace ``ns`` (``__all__`` where it has one, else ``dir``), without
    submodules, typing re-exports and documentation fragments."""
    obj = _resolve(ns)
    names = getattr(obj, "__all__", None) if not isinstance(obj, type) else None
    names = list(names) if names else [n for n in dir(obj) if not n.startswith("_")]
    out = {}
    for n in names:
        if n.startswith("_"):
            continue
        try:
            v = getattr(obj, n)
        except AttributeError:
            continue
        if isinstance(v, types.ModuleType) or (isinstance(v, _NOT_API) and not isinstance(obj, type)):
            continue
        if getattr(v, "__module__", None) in _FOREIGN or n in ("TYPE_CHECKING", "annotations"):
            continue
        out[n] = v
    return out


def left_out(ns: str, name: str) -> str | None:
    """The reason kiln leaves ``ns``'s ``name`` out, or None."""
    key = f"{ns}:{name}"
    for pattern, reason in LEFT_OUT:
        if re.match(pattern, key):
            return reason
    return None


# ------------------------------------------------------------------------------------- signatures

Param = tuple[str, str, str]  # (name, kind, default as source text or "" for none)
_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "positional-only",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
    inspect.Parameter.VAR_POSITIONAL: "*args",
    inspect.Parameter.KEYWORD_ONLY: "keyword-only",
    inspect.Parameter.VAR_KEYWORD: "**kwargs",
}


def _params(sig: inspect.Signature, method: bool) -> list[Param]:
    ps = list(sig.parameters.values())
    if method and ps and ps[0].kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        ps = ps[1:]  # self (kiln binds ops as methods: their first parameter, ``input``, is the tensor)
    out = []
    for p in ps:
        default = "" if p.default is inspect.Parameter.empty else _literal(p.default)
        out.append((p.name, _KINDS[p.kind], default))
    return out


def _literal(value: Any) -> str:
    if isinstance(value, (bool, int, float, str, type(None))):
        return repr(value)
    name = getattr(value, "__name__", None) or str(value)
    return re.sub(r"^(torch|kiln)\.", "", str(name))


def _doc_signatures(obj: Any, name: str, method: bool) -> list[list[Param]]:
    """The overloads a PyTorch builtin's docstring lists in its first lines."""
    doc = inspect.getdoc(obj) or ""
    sigs = []
    for line in doc.splitlines()[:8]:
        line = line.strip().split(" -> ")[0]  # the return annotation may hold parentheses: (Tensor, Tensor[])
        m = re.match(rf"^(?:Tensor\.|torch\.)?(?:linalg\.|special\.|fft\.)?{re.escape(name)}\((.*)\)(\s*->.*)?$", line)
        if not m:
            continue
        args = re.sub(r":\s*[^,=)]+(?=[,=)]|$)", "", m.group(1))  # drop annotations
        try:
            fn = ast.parse(f"def f({args}): pass").body[0]
        except SyntaxError:
            continue
        a = fn.args
        out: list[Param] = []
        pos = a.posonlyargs + a.args
        defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
        for i, (arg, d) in enumerate(zip(pos, defaults, strict=True)):
            unnamed = arg.arg in ("int", "float", "bool", "str")  # ``set_num_interop_threads(int)``
            kind = "positional-only" if i < len(a.posonlyargs) or unnamed else "positional"
            out.append((arg.arg, kind, "" if d is None else ast.unparse(d)))
        if a.vararg:
            out.append((a.vararg.arg, "*args", ""))
        for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            out.append((arg.arg, "keyword-only", "" if d is None else ast.unparse(d)))
        if a.kwarg:
            out.append((a.kwarg.arg, "**kwargs", ""))
        if method and out and out[0][0] == "self":
            out = out[1:]
        sigs.append(out)
    return sigs


# namespace -> the prefix of its functions' ATen operator names (torch.linalg.det is aten::linalg_det)
_ATEN_PREFIX = {"torch.linalg": "linalg_", "torch.special": "special_", "torch.fft": "fft_"}


def _schema_signatures(name: str, method: bool, ns: str = "torch") -> list[list[Param]]:
    """The overloads of ATen operator ``name`` (``torch.ops.aten``), as the Python binding names them:
    the first argument, ``self``, is ``input`` in a function and the tensor itself in a method."""
    import torch

    if ns not in ("torch", "torch.Tensor") and ns not in _ATEN_PREFIX:
        return []  # other namespaces are Python functions: their schemas would be another op's
    try:
        packet = getattr(torch.ops.aten, _ATEN_PREFIX.get(ns, "") + name)
        overloads = [getattr(packet, ov)._schema for ov in packet.overloads()]
    except (AttributeError, RuntimeError):
        return []
    sigs = []
    for schema in overloads:
        args = list(schema.arguments)
        if not args or args[0].name != "self":
            continue  # an overload on Python numbers (``a``, ``b``), not the tensor op
        if method:
            args = args[1:]
        out: list[Param] = []
        for a in args:
            pname = "input" if a.name == "self" else a.name
            default = _literal(a.default_value) if a.has_default_value() else ""
            out.append((pname, "keyword-only" if a.kwarg_only else "positional", default))
        sigs.append(out)
    return sigs


def signatures(obj: Any, name: str, method: bool, ns: str = "torch") -> list[list[Param]]:
    """What can be read of ``obj``'s signature: one parameter list per overload (none: unreadable). For
    PyTorch's C++ builtins, the overloads its docstring lists and those of its ATen operator."""
    target = obj.__init__ if isinstance(obj, type) else obj
    if isinstance(obj, type) and target is object.__init__:
        return []
    if isinstance(obj, property):
        return []
    try:
        return [_params(inspect.signature(target), method or isinstance(obj, type))]
    except (TypeError, ValueError):
        return _doc_signatures(obj, name, method) + _schema_signatures(name, method, ns)


_DTYPE_ALIASES = {"long": "int64", "int": "int32", "float": "float32", "double": "float64", "half": "float16"}


def _norm_default(text: str) -> str:
    text = text.replace("torch.", "").replace("kiln.", "")
    return _DTYPE_ALIASES.get(text, text)


def compare(theirs: list[Param], ours: list[Param]) -> str:
    """'' when ``ours`` serves every call ``theirs`` accepts (see the module docstring), else why not.
    A PyTorch signature of only ``(*args, **kwargs)`` says nothing to compare; a positional-only
    parameter is matched by position, since no call can name it."""
    if theirs and all(p[1] in ("*args", "**kwargs") for p in theirs):
        return ""
    ours_by_name = {p[0]: p for p in ours}
    var_kw = any(p[1] == "**kwargs" for p in ours)
    for i, (name, kind, default) in enumerate(theirs):
        if kind == "positional-only" and i < len(ours) and ours[i][1] in ("positional", "positional-only"):
            continue
        if kind in ("*args", "**kwargs"):
            if not any(p[1] == kind for p in ours):
                return f"no {kind.replace('args', name) if kind == '*args' else '**' + name}"
            continue
        mine = ours_by_name.get(name)
        if mine is None:
            if var_kw and kind == "keyword-only":
                continue
            return f"no parameter {name!r}"
        if mine[1] == "*args" and kind == "positional" and all(p[1] != "positional" for p in theirs[i + 1 :]):
            continue  # ``flip(*dims)`` for ``flip(dims)``: both forms are accepted, as PyTorch's parser does
        if kind == "positional" and (i >= len(ours) or ours[i][0] != name):
            return f"parameter {name!r} is not at position {i}"
        if kind != mine[1] and not (
            (kind == "positional-only" and mine[1] == "positional")
            or (kind == "keyword-only" and mine[1] == "positional")  # one kiln signature for several overloads
        ):
            return f"{name!r} is {mine[1]}, PyTorch's is {kind}"
        if default and not mine[2]:
            return f"{name!r} has no default (PyTorch's: {default})"
        if not default and mine[2] and kind != "keyword-only":
            continue  # kiln's extra default is harmless
        if default and mine[2] and not _same_default(default, mine[2]):
            return f"{name!r} defaults to {mine[2]} (PyTorch's: {default})"
    names = {p[0] for p in theirs}
    by_position = {i for i, p in enumerate(theirs) if p[1] == "positional-only"}
    for j, (name, kind, default) in enumerate(ours):
        if j in by_position:
            continue
        if name not in names and kind in ("positional", "positional-only", "keyword-only") and not default:
            return f"extra required parameter {name!r}"
    return ""


def _same_default(a: str, b: str) -> bool:
    """Whether two defaults (as source text) are the same value: ``[]`` and ``()``, ``1.0 / 8`` and
    ``0.125`` are."""
    if _norm_default(a) == _norm_default(b):
        return True
    if {a, b} <= {"None", "[]", "()"}:  # PyTorch's schemas spell "not given" for a list as [], Python as None
        return True
    # PyTorch's own signatures spell these defaults both ways (``layout=None`` and ``layout=torch.strided``)
    if {_norm_default(a), _norm_default(b)} in ({"None", "strided"}, {"None", "preserve_format"}):
        return True
    if a.startswith("[") and _value(a) != _UNKNOWN and len(set(_value(a))) == 1 and _value(b) == _value(a)[0]:
        return True  # padding=[0, 0] is padding=0
    va, vb = _value(a), _value(b)
    return va is not _UNKNOWN and va == vb


_UNKNOWN = object()


def _value(text: str) -> Any:
    """The value of a literal or of arithmetic on literals, lists as tuples; :data:`_UNKNOWN` otherwise."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return _UNKNOWN

    def ev(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return tuple(ev(e) for e in node.elts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult, ast.Add, ast.Sub)):
            a, b = ev(node.left), ev(node.right)
            return {ast.Div: a / b, ast.Mult: a * b, ast.Add: a + b, ast.Sub: a - b}[type(node.op)]
        raise ValueError(text)

    try:
        v = ev(tree)
    except (ValueError, TypeError, ZeroDivisionError):
        return _UNKNOWN
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


# ------------------------------------------------------------------------------------------ survey


def survey_namespace(ns: str, kns: str) -> list[Row]:
    """The rows of one namespace, sorted by name."""
    try:
        ours = _resolve(kns)
    except ImportError as exc:
        ours, why = None, f"{kns} does not import: {exc}"
    rows = []
    method = ns.endswith(".Tensor")
    for name, theirs in sorted(torch_names(ns).items(), key=lambda kv: kv[0].lower()):
        reason = left_out(ns, name)
        mine = getattr(ours, name, _ABSENT) if ours is not None else _ABSENT
        if mine is _ABSENT:
            if reason:
                rows.append(Row(name, "left out", reason))
            else:
                rows.append(Row(name, "missing", why if ours is None else ""))
            continue
        t_sigs = signatures(theirs, name, method, ns)
        k_sigs = signatures(mine, name, method, ns="kiln")  # never PyTorch's schemas for kiln's side
        if not t_sigs or not k_sigs:
            rows.append(Row(name, "ok"))
            continue
        diffs = [compare(t, k_sigs[0]) for t in t_sigs]
        rows.append(Row(name, "ok") if "" in diffs else Row(name, "differs", diffs[0]))
    return rows


def survey() -> dict[str, list[Row]]:
    """Every namespace's rows, in :data:`NAMESPACES` order."""
    return {ns: survey_namespace(ns, kns) for ns, kns in NAMESPACES}


def counts(rows: list[Row]) -> dict[str, int]:
    """How many rows have each status."""
    out = dict.fromkeys(("ok", "differs", "left out", "missing"), 0)
    for r in rows:
        out[r.status] += 1
    return out


# ------------------------------------------------------------------------------------------ render


def render() -> str:
    """The reStructuredText of the coverage page: a summary table, then each namespace's names that are not
    simply ``ok``: missing ones, signature differences with their notes, and left-out names by reason."""
    data = survey()
    lines = [
        ".. list-table:: Coverage per namespace",
        "   :header-rows: 1",
        "",
        "   * - PyTorch namespace",
        "     - kiln",
        "     - names",
        "     - ok",
        "     - signature differs",
        "     - left out",
        "     - missing",
    ]
    kiln_of = dict(NAMESPACES)
    for ns, rows in data.items():
        c = counts(rows)
        lines += [
            f"   * - ``{ns}``",
            f"     - ``{kiln_of[ns]}``",
            f"     - {len(rows)}",
            f"     - {c['ok']}",
            f"     - {c['differs']}",
            f"     - {c['left out']}",
            f"     - {c['missing']}",
        ]
    lines.append("")
    for ns, rows in data.items():
        rest = [r for r in rows if r.status != "ok"]
        if not rest:
            continue
        title = f"``{ns}``"
        lines += [title, "-" * len(title), ""]
        for status in ("missing", "differs"):
            group = [r for r in rest if r.status == status]
            if group:
                lines += [f"**{status}** ({len(group)}):", ""]
                for r in group:
                    note = SIGNATURE_NOTES.get(f"{ns}:{r.name}")
                    detail = f": {r.detail}" if r.detail else ""
                    lines.append(f"- ``{r.name}``{detail}" + (f" — *{note}*" if note else ""))
                lines.append("")
        left = [r for r in rest if r.status == "left out"]
        if left:
            lines += [f"**left out** ({len(left)}), by reason:", ""]
            for reason in dict.fromkeys(r.detail for r in left):
                names = ", ".join(f"``{r.name}``" for r in left if r.detail == reason)
                lines.append(f"- {reason}: {names}")
            lines.append("")
    return "\n".join(lines)
