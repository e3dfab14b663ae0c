"""Per-op tables kept outside the op record stay in step with it: every name they key by is an op (or,
for the core tests' input-range tables, a public name of one), and kiln-testing's SPECS holds only what
inference from the op's tags and signature cannot know (input ranges, variants, hand-written cases).

So renaming or dropping an op fails here, naming the table and the key, instead of silently leaving
a table entry that no test reads."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import numpy as np
import pytest

import kiln
import kiln.backend as kb
import kiln_testing
from kiln_testing._specs import SPECS, Ctx, T, _from_tags, infer_spec, spec_for

ALL_DTYPES = kb.ALL_DTYPES
CORE_TESTS = Path(__file__).resolve().parents[2] / "kiln" / "tests"

# The core tests' tables that hold per-op input domains ((low, high) for random inputs): file -> tables.
# Each key starts with the name it tests (an op, an alias or method of one, or an operator symbol),
# then an optional description ("div trunc", "logit eps").
RANGE_TABLES = {
    "test_math_ops.py": ("UNARY", "BINARY", "INPLACE", "GRADCHECK"),
    "test_elementwise.py": ("BINARY_FLOAT", "UNARY"),
}


def _spec_modules() -> dict[str, dict]:
    """Every ``kiln_testing._specs*`` module's own SPECS table (before the merge into ``_specs.SPECS``)."""
    found = {}
    for info in pkgutil.iter_modules(kiln_testing.__path__):
        if info.name.startswith("_specs"):
            module = importlib.import_module(f"kiln_testing.{info.name}")
            found[info.name] = dict(module.SPECS)
    return found


def test_every_specs_key_is_an_op():
    ops = kb.ops()
    tables = _spec_modules()
    assert "_specs" in tables and len(tables) > 1
    stale = {name: sorted(set(table) - set(ops)) for name, table in tables.items() if set(table) - set(ops)}
    assert not stale, f"SPECS tables name ops the core does not define: {stale}"
    seen: dict[str, str] = {}
    twice = []
    for module, table in tables.items():
        if module == "_specs":
            continue  # holds the merge
        for op_name in table:
            if op_name in seen:
                twice.append((op_name, seen[op_name], module))
            seen[op_name] = module
    assert not twice, f"ops with a spec in two modules: {twice}"


def test_every_op_has_an_inferred_or_listed_spec():
    missing = [name for name, opdef in kb.ops().items() if spec_for(opdef) is None]
    assert not missing, f"ops with neither a SPECS entry nor a spec inferred from their tags and signature: {missing}"


def _fingerprint(name: str, spec) -> list:
    def enc(a):
        if isinstance(a, T):
            return ("T", a.layout, a.shape, str(a.dtype), a.on, a.grad, a.base.dtype.str, a.base.tobytes())
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, *map(enc, a))
        if isinstance(a, dict):
            return tuple((k, enc(v)) for k, v in a.items())
        if isinstance(a, float) and np.isnan(a):
            return "nan"
        return repr(a)

    cases = [
        (str(d), c.label, enc(c.args), enc(c.kwargs), c.values, c.grad, c.inplace)
        for d in ALL_DTYPES
        for c in spec.cases(Ctx(name, d, ALL_DTYPES))
    ]
    return [spec.rtol, spec.atol, spec.view, cases]


def test_no_specs_entry_repeats_what_inference_gives():
    """An entry equal to the inferred spec is a hand-kept copy of the op record: delete it."""
    redundant = []
    for name, spec in SPECS.items():
        opdef = kb.op(name)
        inferred = infer_spec(opdef)
        if inferred is not None and _fingerprint(name, _from_tags(inferred, opdef)) == _fingerprint(
            name, _from_tags(spec, opdef)
        ):
            redundant.append(name)
    assert not redundant, f"SPECS entries that inference from tags and signature gives as they are: {redundant}"


def test_inference_follows_the_tags():
    ops = kb.ops()
    labels = {n: {c.label for c in spec_for(ops[n]).cases(Ctx(n, kiln.float32, ALL_DTYPES))} for n in ops}
    for name in kb.ops("pointwise"):
        if name not in SPECS and infer_spec(ops[name]) is not None:
            assert "specials" in labels[name] or "broadcast" in labels[name], name
    for name in ("amax", "_max_dim", "logsumexp", "cumsum"):  # (values, indices) and required dims included
        assert name not in SPECS and infer_spec(ops[name]) is not None, name
    assert "contiguous[dim=(0, 2)]" in labels["logsumexp"]
    assert "contiguous[dim=1,dtype=kiln.float64]" in labels["cumsum"]
    for name in kb.ops("view"):
        assert spec_for(ops[name]).view == ("backward" not in ops[name].tags), name


def _table_keys(path: Path, table: str) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == table and isinstance(node.value, ast.Dict):
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise AssertionError(f"{path.name} has no table {table} (renamed? update RANGE_TABLES)")


def _names_an_op(key: str, ops: dict) -> bool:
    word = re.match(r"[A-Za-z_][A-Za-z0-9_]*", key)
    if word is None:
        return True  # an operator symbol ("%", "+x", "//="): no name to go stale
    word = word.group(0)
    name = word[:-1] if word.endswith("_") and not word.startswith("_") else word  # the in-place form
    if name in ops or word in ops:
        return True
    # an alias or method of an op (arcsin, clip, fix, Tensor.negative): a public name that exists
    return callable(getattr(kiln, name, None)) or callable(getattr(kiln.Tensor, word, None))


@pytest.mark.skipif(not CORE_TESTS.is_dir(), reason="the core's tests are not next to kiln-testing")
@pytest.mark.parametrize("filename", sorted(RANGE_TABLES))
def test_core_range_tables_name_ops(filename):
    ops = kb.ops()
    path = CORE_TESTS / filename
    stale = {
        table: bad
        for table in RANGE_TABLES[filename]
        if (bad := [k for k in _table_keys(path, table) if not _names_an_op(k, ops)])
    }
    assert not stale, f"{filename}: table keys that name no op nor public name of one: {stale}"
