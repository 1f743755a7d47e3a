"""Every third-party module that kerascope/ and tests/ import is declared where the test command installs it.

The test command runs in a brand-new virtual environment (``.ci/run``), so an import that only the
developer's machine satisfies must fail by name. ``scripts/check_imports.py`` is that check; it also runs
in ``scripts/test.sh`` before pytest, because a missing package imported by ``conftest.py`` stops pytest
before any test could report it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_imports  # noqa: E402


def test_the_repository_declares_every_import() -> None:
    assert check_imports.undeclared() == {}


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    """A copy of the repository's install files, with a package and tests that import what we choose."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    (tmp_path / "kerascope").mkdir()
    (tmp_path / "kerascope" / "__init__.py").write_text("import numpy\nimport keras\nfrom PIL import Image\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "_helper.py").write_text("import os\n")
    return tmp_path


def test_an_undeclared_import_is_named_with_its_files(fake_repo: Path) -> None:
    (fake_repo / "tests" / "conftest.py").write_text(
        "import _helper\nimport pytest\nfrom hypothesis import given\nimport notapackage_xyz.sub\n"
        "def f():\n    pytest.importorskip('another_missing_pkg')\n"
    )
    missing = check_imports.undeclared(fake_repo)
    # hypothesis is declared in the test extra; stdlib, local helper modules and kerascope are not packages
    assert set(missing) == {"notapackage_xyz", "another_missing_pkg"}
    assert missing["notapackage_xyz"] == {"tests/conftest.py"}


def test_a_package_only_in_test_sh_counts_as_declared(fake_repo: Path) -> None:
    (fake_repo / "tests" / "test_x.py").write_text("import zennit\nimport captum.attr\n")
    assert check_imports.undeclared(fake_repo) == {}
    script = fake_repo / "scripts" / "test.sh"
    script.write_text(script.read_text().replace('"zennit==0.5.1"', ""))
    assert set(check_imports.undeclared(fake_repo)) == {"zennit"}


def test_import_names_that_differ_from_their_distribution(fake_repo: Path) -> None:
    (fake_repo / "tests" / "test_x.py").write_text("import sklearn\nimport skimage\nimport PIL\n")
    assert check_imports.undeclared(fake_repo) == {}  # scikit-learn, scikit-image, pillow are declared
    pyproject = fake_repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"scikit-learn>=1.3", ', ""))
    assert set(check_imports.undeclared(fake_repo)) == {"sklearn"}


def test_the_script_exits_1_and_names_the_module(fake_repo: Path) -> None:
    script = str(ROOT / "scripts" / "check_imports.py")
    clean = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=ROOT)
    assert (clean.returncode, clean.stderr) == (0, "")
    (fake_repo / "tests" / "conftest.py").write_text("from hypothesis_typo import given\n")
    failed = subprocess.run([sys.executable, script, str(fake_repo)], capture_output=True, text=True)
    assert failed.returncode == 1
    assert "Undeclared import: 'hypothesis_typo' (imported by tests/conftest.py)" in failed.stderr
    assert "pyproject.toml" in failed.stderr
