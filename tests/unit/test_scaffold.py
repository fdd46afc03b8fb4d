"""`tracerl init`'s project writer: names it refuses, files it writes, never overwriting."""

from __future__ import annotations

import ast

import pytest

from tracerl.errors import UserError
from tracerl.scaffold import FILES, check_name, init_project


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("UnitConv", "lowercase"),
        ("unit-conv", "lowercase"),
        ("1conv", "lowercase"),
        ("import", "keyword"),
        ("os", "standard library"),
        ("pydantic", "installed"),
        ("tests", "reserved"),
    ],
)
def test_bad_names_are_refused_saying_why(name, why):
    with pytest.raises(UserError, match=why) as e:
        check_name(name)
    assert "\n" not in str(e.value)


def test_the_project_is_written_rendered_and_never_overwritten(tmp_path):
    project = init_project("my_units", tmp_path / "new")  # the parent is made too
    written = sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
    assert written == sorted(dest.format(name="my_units") for dest in FILES)
    for path in project.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "{{" not in text, path
            if path.suffix == ".py":
                ast.parse(text, str(path))
    assert "from my_units.rewards import" in (project / "my_units" / "env.py").read_text()
    assert "name: my_units.env:UnitConv" in (project / "configs/my_units.yaml").read_text()

    (project / "README.md").write_text("mine")
    with pytest.raises(UserError, match="already exists"):
        init_project("my_units", tmp_path / "new")
    assert (project / "README.md").read_text() == "mine"
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["my_units"]  # no leftovers
