"""A plugin that raises on import never breaks kiln; it is reported, and the environment controls it.

architecture page, "Plugins": loading is lazy and guarded; ``KILN_DISABLE_PLUGINS``, ``KILN_PLUGINS`` and
``KILN_STRICT_PLUGINS`` control it; ``kiln plugins`` (and ``python -m kiln plugins --json``) report it.
"""

from __future__ import annotations

import pytest

ERROR_TEXT = "kiln_broken_plugin is deliberately broken for the integration tests"
COMPUTE = "import kiln; print((kiln.ones(2) + 1).tolist())"


@pytest.fixture(scope="module")
def with_broken(venv, broken_plugin):
    """The broken plugin installed for this module (uninstalled at its end)."""
    with venv.installed(broken_plugin.wheel, broken_plugin.name):
        yield venv


def test_import_and_compute_still_work(with_broken):
    proc = with_broken.py(COMPUTE)
    assert proc.stdout.strip() == "[2.0, 2.0]"
    assert proc.stderr == ""  # guarded: no traceback, no warning spam


def test_console_script_lists_the_error(with_broken):
    proc = with_broken.kiln("plugins")
    out = proc.stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("broken ")), None)
    assert line is not None, out
    assert "[error]" in line
    assert "kiln-broken-plugin 0.0.1" in line
    assert ERROR_TEXT in out
    assert "kiln.reference" in out and "[loaded]" in out


def test_console_script_verbose_shows_the_traceback(with_broken):
    out = with_broken.kiln("plugins", "--verbose").stdout
    assert "Traceback" in out and ERROR_TEXT in out


@pytest.mark.parametrize("via", ["module", "script"])
def test_json_lists_the_error(with_broken, helpers, via):
    report = with_broken.plugins_json(via=via)
    row = helpers.row(report, "broken")
    assert row["status"] == "error"
    assert ERROR_TEXT in row["error"]
    assert "ImportError" in row["error"]
    assert row["distribution"] == "kiln-broken-plugin"
    assert row["version"] == "0.0.1"
    assert row["module"] == "kiln_broken_plugin"
    assert row["hooks"] == [] and row["op_coverage"] == {}
    ref = helpers.row(report, "kiln.reference")
    assert ref["status"] == "loaded" and ref["error"] is None
    assert "cpu" in report["devices"]


def test_doctor_reports_the_broken_plugin(with_broken):
    proc = with_broken.kiln("doctor", check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "broken" in proc.stdout and ERROR_TEXT in proc.stdout


def test_using_a_missing_device_names_the_broken_plugin(with_broken):
    proc = with_broken.py(
        """
        import kiln
        try:
            kiln.zeros(1, device="vendorx")
        except RuntimeError as e:
            print(e)
        else:
            raise SystemExit("no error for an unregistered device type")
        """
    )
    assert "vendorx" in proc.stdout and "broken" in proc.stdout


def test_disable_hides_the_error(with_broken, helpers):
    env = {"KILN_DISABLE_PLUGINS": "broken"}
    report = with_broken.plugins_json(env=env)
    row = helpers.row(report, "broken")
    assert row["status"] == "disabled"
    assert row["error"] is None
    assert "[disabled]" in with_broken.kiln("plugins", env=env).stdout
    assert ERROR_TEXT not in with_broken.kiln("plugins", env=env).stdout
    assert with_broken.kiln("doctor", env=env, check=False).returncode == 0
    assert with_broken.py(COMPUTE, env=env).stdout.strip() == "[2.0, 2.0]"


def test_allow_list_excludes_unlisted_plugins(with_broken, helpers):
    env = {"KILN_PLUGINS": "some-other-plugin"}
    row = helpers.row(with_broken.plugins_json(env=env), "broken")
    assert row["status"] == "disabled" and row["error"] is None
    # The built-in reference backend is not an entry point: an allow list never removes it.
    proc = with_broken.py(
        """
        import kiln
        from kiln import _plugins
        print((kiln.ones(2) + 1).tolist(), [p.name for p in _plugins.plugins() if p.error])
        """,
        env=env,
    )
    assert proc.stdout.strip() == "[2.0, 2.0] []"


def test_allow_list_naming_the_plugin_loads_it(with_broken, helpers):
    row = helpers.row(with_broken.plugins_json(env={"KILN_PLUGINS": "broken"}), "broken")
    assert row["status"] == "error"


def test_strict_mode_fails_on_first_use_naming_the_plugin(with_broken):
    env = {"KILN_STRICT_PLUGINS": "1"}
    # import alone never loads plugins, so it succeeds even in strict mode
    assert with_broken.py("import kiln; print('ok')", env=env).stdout.strip() == "ok"
    proc = with_broken.py(COMPUTE, env=env, check=False)
    assert proc.returncode != 0
    assert "broken" in proc.stderr and "KILN_STRICT_PLUGINS" in proc.stderr
    assert ERROR_TEXT in proc.stderr  # the cause is chained
    # the CLI fails too
    cli = with_broken.kiln("plugins", env=env, check=False)
    assert cli.returncode != 0 and "broken" in cli.stderr


def test_strict_mode_with_the_plugin_disabled_is_fine(with_broken):
    env = {"KILN_STRICT_PLUGINS": "1", "KILN_DISABLE_PLUGINS": "broken"}
    assert with_broken.py(COMPUTE, env=env).stdout.strip() == "[2.0, 2.0]"


def test_strict_mode_keeps_failing_after_the_first_error(with_broken):
    proc = with_broken.py(
        """
        import kiln
        for attempt in range(2):
            try:
                kiln.ones(2) + 1
            except RuntimeError as e:
                print("raised", attempt)
            else:
                print("worked", attempt)
        """,
        env={"KILN_STRICT_PLUGINS": "1"},
    )
    assert proc.stdout.split() == ["raised", "0", "raised", "1"]


def test_trace_mentions_the_failure(with_broken):
    proc = with_broken.py(COMPUTE, env={"KILN_TRACE_PLUGINS": "1"})
    assert proc.stdout.strip() == "[2.0, 2.0]"
    assert "broken" in proc.stderr and "[kiln plugins]" in proc.stderr


def test_uninstalling_leaves_kiln_working(with_broken, broken_plugin, helpers):
    venv = with_broken
    venv.uninstall(broken_plugin.name)
    try:
        assert venv.py(COMPUTE).stdout.strip() == "[2.0, 2.0]"
        report = venv.plugins_json()
        assert "broken" not in {r["name"] for r in report["plugins"]}
        assert all(r["status"] == "loaded" for r in report["plugins"])
        assert venv.kiln("doctor").returncode == 0
    finally:
        venv.install(broken_plugin.wheel)  # leave the module fixture's state as it was
