"""``import kiln`` in a fresh venv is cheap: no pluggy, no numba, no ml_dtypes, no plugin imported.

architecture page, "Plugins" and "Correctness and performance": plugins load on first use, never at import; Numba never compiles at import. Timing is
printed (run with ``-s`` to see it), never asserted: machines are noisy.
"""

from __future__ import annotations

import re

import pytest

HEAVY = ("pluggy", "numba", "ml_dtypes", "kiln_sentinel_plugin")


@pytest.fixture(scope="module")
def with_sentinel(venv, sentinel_plugin):
    """A harmless installed plugin, so 'no plugin imported at import kiln' is observable."""
    with venv.installed(sentinel_plugin.wheel, sentinel_plugin.name):
        yield venv


def test_import_does_not_load_plugins_or_heavy_modules(with_sentinel):
    r = with_sentinel.py_json(
        f"""
        import json, sys
        import kiln
        after_import = {{m: m in sys.modules for m in {HEAVY!r}}}
        plugins = sys.modules.get("kiln._plugins")
        loaded_at_import = bool(plugins is not None and plugins._loaded)
        (kiln.ones(2) + 1).tolist()  # first use loads the plugins
        after_use = {{m: m in sys.modules for m in {HEAVY!r}}}
        print(json.dumps([after_import, loaded_at_import, after_use, sys.modules["kiln._plugins"]._loaded]))
        """
    )
    after_import, loaded_at_import, after_use, loaded_after_use = r
    assert not any(after_import.values()), after_import
    assert loaded_at_import is False
    # the probe is meaningful: first use does import the plugin (and pluggy)
    assert loaded_after_use is True
    assert after_use["kiln_sentinel_plugin"] and after_use["pluggy"]


def test_import_time(venv):
    code = "import time; t = time.perf_counter(); import kiln; print(time.perf_counter() - t)"
    samples = [float(venv.py(code).stdout.strip()) for _ in range(5)]
    proc = venv.py("import kiln", args=("-X", "importtime"))
    cumulative = {}
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\S.*)$", line)
        if m:
            cumulative[m.group(3).strip()] = int(m.group(2))
    assert "kiln" in cumulative, proc.stderr[-2000:]
    top = sorted(((us, name) for name, us in cumulative.items() if name.lstrip() != "kiln"), reverse=True)[:5]
    print(
        f"\n[integration] import kiln: best of 5 {min(samples) * 1e3:.1f} ms "
        f"(all: {', '.join(f'{s * 1e3:.1f}' for s in samples)} ms); -X importtime cumulative "
        f"{cumulative['kiln'] / 1e3:.1f} ms; heaviest: "
        + ", ".join(f"{name.strip()} {us / 1e3:.1f} ms" for us, name in top)
    )
