"""The READMEs say what exists now: the root README's packages table has a row for every package in
``packages/``, its "Not built yet" line names exactly the planned packages that are not there, no README
calls an existing package planned, and the nox matrix it describes is the noxfile's ``BACKENDS``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PLANNED = {"kiln-cuda", "kiln-amp", "kiln-distributed", "kiln-compile"}


@pytest.fixture(scope="module")
def readme() -> str:
    path = ROOT / "README.md"
    if not (path.is_file() and (ROOT / "packages").is_dir()):
        pytest.skip("not a checkout of the kiln repository")
    return path.read_text(encoding="utf-8")


def _packages() -> set[str]:
    return {p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml")}


def test_every_package_has_a_row_in_the_packages_table(readme):
    rows = set(re.findall(r"^\| \[([\w-]+)\]\(packages/\1\) \|", readme, re.MULTILINE))
    assert rows == _packages()


def test_not_built_yet_names_exactly_the_missing_packages(readme):
    line = re.search(r"^Not built yet: (.*)$", readme, re.MULTILINE)
    assert line, "the root README names the packages that do not exist yet"
    named = set(re.findall(r"`([\w-]+)`", line.group(1)))
    assert named == PLANNED - _packages()


def test_no_readme_calls_an_existing_package_planned(readme):
    for path in [ROOT / "README.md", *sorted((ROOT / "packages").glob("*/README.md"))]:
        text = path.read_text(encoding="utf-8")
        for name in _packages():
            pattern = rf"`?{re.escape(name)}`?[^.\n]{{0,40}}\b(planned|not built|not yet|coming)\b"
            assert not re.search(pattern, text, re.IGNORECASE), f"{path} calls {name} planned"


def test_the_described_test_matrix_is_the_noxfiles(readme):
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    backends = next(
        [ast.literal_eval(key) for key in node.value.keys]
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "BACKENDS"
    )
    sentence = re.search(r"shows the matrix: (.*?);", readme, re.DOTALL)
    assert sentence, "the root README describes the nox test matrix"
    described = set(re.findall(r"`([\w-]+)` \(", sentence.group(1)))
    assert described == set(backends)
