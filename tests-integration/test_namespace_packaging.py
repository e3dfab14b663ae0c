"""Feature distributions contribute ``kiln/<feature>/`` without a ``kiln/__init__.py`` of their own.

architecture page, "The packages": the core's ``kiln/__init__.py`` extends ``__path__`` with ``pkgutil.extend_path``; wheels and
editable installs (plain ``.pth`` path entries, hatchling's default) must both import every namespace.
"""

from __future__ import annotations

import json

import pytest

FEATURE_DIST = "kiln-dummyfeat"
PROBE = """
import json, kiln, kiln.dummyfeat
print(json.dumps({
    "value": kiln.dummyfeat.VALUE,
    "uses_core": kiln.dummyfeat.double_ones(),
    "file": kiln.dummyfeat.__file__,
    "kiln_file": kiln.__file__,
    "path": list(kiln.__path__),
}))
"""


@pytest.fixture(scope="module")
def feature(dists):
    """A tiny feature distribution shipping only ``src/kiln/dummyfeat/__init__.py``."""
    d = dists.project(
        FEATURE_DIST,
        {
            "src/kiln/dummyfeat/__init__.py": '''
                """A feature package living in the kiln namespace (integration tests)."""
                import kiln

                VALUE = 7


                def double_ones():
                    """Proof that the feature sees the core."""
                    return (kiln.ones(2) * 2).tolist()
                ''',
        },
        version="0.0.1",
        packages=["src/kiln"],
    )
    assert not (d.project / "src" / "kiln" / "__init__.py").exists()
    return dists.wheel(d)


def _check(probe: dict, expect_in: str) -> None:
    assert probe["value"] == 7
    assert probe["uses_core"] == [2.0, 2.0]
    assert probe["file"].startswith(expect_in), (probe["file"], expect_in)


def test_wheel_in_site_packages(venv, feature):
    with venv.installed(feature.wheel, FEATURE_DIST):
        probe = venv.py_json(PROBE)
        site = probe["kiln_file"].rsplit("/kiln/", 1)[0]
        _check(probe, site)
    # uninstalling the feature removes only its own files: the core is intact
    assert venv.py("import kiln; print((kiln.ones(1) + 1).tolist())").stdout.strip() == "[2.0]"
    assert venv.py("import importlib.util as u; print(u.find_spec('kiln.dummyfeat'))").stdout.strip() == "None"


def test_wheel_on_a_separate_path_entry(venv, feature, tmp_path):
    # A wheel unpacked into another sys.path entry: only extend_path can make kiln.dummyfeat visible.
    target = tmp_path / "extra-site"
    venv.pip("install", "-q", "--no-deps", "--no-index", "--target", str(target), str(feature.wheel))
    assert not (target / "kiln" / "__init__.py").exists()
    probe = venv.py_json(PROBE, env={"PYTHONPATH": str(target)})
    _check(probe, str(target))
    assert str(target / "kiln") in probe["path"]
    assert probe["kiln_file"].startswith(str(venv.root))  # the core's __init__ still wins


def test_editable_install(venv, feature):
    with venv.installed(feature.project, FEATURE_DIST, editable=True):
        probe = venv.py_json(PROBE)
        _check(probe, str(feature.project / "src" / "kiln"))
        assert str(feature.project / "src" / "kiln") in probe["path"]
        assert probe["kiln_file"].startswith(str(venv.root))
        # an edit to the source is seen without reinstalling
        init = feature.project / "src" / "kiln" / "dummyfeat" / "__init__.py"
        original = init.read_text()
        init.write_text(original.replace("VALUE = 7", "VALUE = 8"))
        try:
            assert json.loads(venv.py("import kiln.dummyfeat as f; print(f.VALUE)").stdout) == 8
        finally:
            init.write_text(original)
        # the kiln command still works with the feature on the path
        assert venv.kiln("plugins").returncode == 0
    assert venv.py("import importlib.util as u; print(u.find_spec('kiln.dummyfeat'))").stdout.strip() == "None"
