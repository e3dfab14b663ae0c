"""``KILN_PLUGINS`` and ``KILN_DISABLE_PLUGINS``: names are entry-point or distribution names, names that
match no installed plugin are reported in a warning, and an empty value means unset.

Each case runs in a fresh interpreter (plugins load once per process) with a fake distribution
``kiln-fake`` (entry point ``fake``) on its path: a ``.dist-info`` directory and a module, which is all
``importlib.metadata`` needs to find an entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import json, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import kiln.plugins
        infos = kiln.plugins.plugins()
    print(json.dumps({
        "disabled": sorted(p.name for p in infos if p.disabled),
        "loaded": sorted(p.name for p in infos if not p.disabled and not p.error),
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    }))
    """
)


@pytest.fixture(scope="module")
def fake_dist(tmp_path_factory):
    """A directory holding distribution kiln-fake 1.0 with entry point ``fake`` in group ``kiln``."""
    root = tmp_path_factory.mktemp("fake_dist")
    (root / "kiln_fake_plugin.py").write_text(
        "def kiln_register_extensions(register):\n    register('fake-extension', '1.0')\n"
    )
    info = root / "kiln_fake-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-fake\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kiln]\nfake = kiln_fake_plugin\n")
    return root


def probe(fake_dist, **env_vars) -> dict:
    """Load plugins in a fresh interpreter with ``env_vars``: disabled and loaded plugins, warnings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["PYTHONPATH"] = os.pathsep.join([str(fake_dist), *filter(None, [env.get("PYTHONPATH")])])
    env.update(env_vars)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def kiln_warnings(result: dict) -> list[str]:
    return [w for w in result["warnings"] if "KILN_" in w]


def test_the_fake_distribution_loads_without_the_variables(fake_dist):
    r = probe(fake_dist)
    assert "fake" in r["loaded"] and not kiln_warnings(r)


@pytest.mark.parametrize("name", ["fake", "kiln-fake", "kiln_fake", "Kiln-Fake"])
def test_disable_by_entry_point_or_distribution_name(fake_dist, name):
    r = probe(fake_dist, KILN_DISABLE_PLUGINS=name)
    assert "fake" in r["disabled"] and "fake" not in r["loaded"]
    assert not kiln_warnings(r)


def test_an_unknown_name_to_disable_warns_listing_the_installed_plugins(fake_dist):
    r = probe(fake_dist, KILN_DISABLE_PLUGINS="kiln-fak, nothing-like-it")
    assert "fake" in r["loaded"]  # nothing was disabled
    (warning,) = kiln_warnings(r)
    assert warning.startswith("UserWarning: KILN_DISABLE_PLUGINS names no installed kiln plugin:")
    assert "'kiln-fak', 'nothing-like-it'" in warning
    assert "fake (kiln-fake)" in warning  # the installed plugins: entry-point name (distribution)
    assert "Did you mean 'kiln-fake' instead of 'kiln-fak'?" in warning


def test_the_reference_backend_cannot_be_disabled_and_says_so(fake_dist):
    r = probe(fake_dist, KILN_DISABLE_PLUGINS="kiln.reference")
    assert "kiln.reference" in r["loaded"]
    (warning,) = kiln_warnings(r)
    assert "'kiln.reference' is kiln's built-in reference backend" in warning and "always loads" in warning


def test_allow_list_by_distribution_name(fake_dist):
    r = probe(fake_dist, KILN_PLUGINS="kiln-fake")
    assert "fake" in r["loaded"] and not kiln_warnings(r)
    assert set(r["loaded"]) == {"fake", "kiln.reference"}


def test_an_unknown_name_in_the_allow_list_warns(fake_dist):
    r = probe(fake_dist, KILN_PLUGINS="fakes")
    assert "fake" in r["disabled"]  # an allow list still applies: only what it names loads
    (warning,) = kiln_warnings(r)
    assert "KILN_PLUGINS names no installed kiln plugin: 'fakes'" in warning
    assert "Did you mean 'fake' instead of 'fakes'?" in warning


def test_allowing_only_the_reference_backend_is_not_a_typo(fake_dist):
    r = probe(fake_dist, KILN_PLUGINS="kiln.reference")
    assert r["loaded"] == ["kiln.reference"] and "fake" in r["disabled"]
    assert not kiln_warnings(r)


@pytest.mark.parametrize("value", ["", "  ", " , "])
def test_an_empty_allow_list_means_unset(fake_dist, value):
    r = probe(fake_dist, KILN_PLUGINS=value)
    assert "fake" in r["loaded"] and not r["disabled"]
    assert not kiln_warnings(r)
