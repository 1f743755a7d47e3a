"""Fail when kerascope/ or tests/ import a third-party module that no install step declares.

The README's test command runs in a brand-new virtual environment, so a package that is only present
on the developer's machine must fail here, by name, before pytest even collects (a missing package
imported by ``tests/conftest.py`` would otherwise stop the run with a bare ``ModuleNotFoundError``).

A module counts as declared when the distribution that provides it is named in ``pyproject.toml``
(dependencies or any extra) or in a ``pip install`` line of ``scripts/test.sh``. Imports are read
with :mod:`ast` (``import x``, ``from x import y``, ``pytest.importorskip("x")``,
``importlib.import_module("x")``); nothing is imported. Standard-library only, so it runs before
the install too.

Example::

    python scripts/check_imports.py          # exit 0, or 1 naming each undeclared module
    python scripts/check_imports.py DIR      # another checkout
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import tomllib  # Python >= 3.11, the version the README's commands use

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("kerascope", "tests")
# import name -> distribution, for the few whose names differ and that may not be installed yet
KNOWN = {"PIL": "pillow", "skimage": "scikit-image", "sklearn": "scikit-learn", "yaml": "pyyaml"}
_CALLS = {"importorskip", "import_module", "find_spec"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(paths: Iterable[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Top-level module name -> the files (relative to ``root``) that import it (imports and import calls)."""
    found: dict[str, set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in _CALLS and isinstance(node.args[0].value, str):
                    names = [node.args[0].value]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(root)))
    return found


def declared_distributions(root: Path = ROOT) -> set[str]:
    """Normalised distribution names in pyproject.toml's requirement strings and test.sh's pip lines."""
    names: set[str] = set()
    requirement = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project.get("optional-dependencies", {}).values()
    for spec in [*project.get("dependencies", []), *(spec for extra in extras for spec in extra)]:
        match = requirement.match(spec)
        if match:
            names.add(_normalise(match.group(1)))
    for line in (root / "scripts" / "test.sh").read_text(encoding="utf-8").splitlines():
        if "pip install" not in line or line.lstrip().startswith("#"):
            continue
        for token in line.split("pip install", 1)[1].split():
            token = token.strip("\"'")
            if token.startswith("-") or token.startswith(".") or token.startswith("$") or token in {"&&", "||"}:
                continue
            match = requirement.match(token)
            if match:
                names.add(_normalise(match.group(1)))
    return names


def local_modules(root: Path = ROOT) -> set[str]:
    """Names that resolve inside the repository (the package, tests' helper modules, bench, scripts)."""
    names = {"kerascope", "tests", "bench", "scripts"}
    names |= {p.stem for folder in ("tests", "scripts") for p in (root / folder).glob("*.py")}
    return names


@functools.cache
def _installed() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions_of(module: str) -> list[str]:
    """The distributions that provide ``module`` in this environment, else the known / same name."""
    installed = _installed().get(module, [])
    return [_normalise(d) for d in installed] or [_normalise(KNOWN.get(module, module))]


def undeclared(root: Path = ROOT) -> dict[str, set[str]]:
    """Third-party modules imported by ``SCANNED`` whose distribution no install step names."""
    files = [p for folder in SCANNED for p in sorted((root / folder).rglob("*.py"))]
    declared = declared_distributions(root)
    skip = local_modules(root) | set(sys.stdlib_module_names) | {"__future__"}
    missing: dict[str, set[str]] = {}
    for module, where in imported_modules(files, root).items():
        if module in skip:
            continue
        if not any(dist in declared for dist in distributions_of(module)):
            missing[module] = where
    return missing


def main(argv: list[str] | None = None) -> int:
    """Print one line per undeclared import to stderr; exit status 1 when there is any."""
    args = sys.argv[1:] if argv is None else argv
    missing = undeclared(Path(args[0]).resolve() if args else ROOT)
    for module, where in sorted(missing.items()):
        files = ", ".join(sorted(where)[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
        dists = " or ".join(distributions_of(module))
        print(
            f"Undeclared import: '{module}' (imported by {files}). Received: no install step names {dists}. "
            "Add it to the `test` extra of pyproject.toml (or to scripts/test.sh's install step).",
            file=sys.stderr,
        )
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
