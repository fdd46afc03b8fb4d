"""Environments by name, entry point and import path; rebuilt from a receipt elsewhere."""

from __future__ import annotations

import pickle
import sys
import textwrap

import pytest

from tracerl.envs.registry import _REGISTRY, env_factory, make, make_from_spec, resolve
from tracerl.errors import NotFoundError, UserError

MODULE = """
from tracerl.envs import RefundDesk, register


class Desk(RefundDesk):
    name = "legacy_desk"


register("legacy_desk", Desk)  # the old way: a module that registers on import
"""


@pytest.fixture
def legacy(tmp_path, monkeypatch):
    (tmp_path / "legacy_envs.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "legacy_envs"
    sys.modules.pop("legacy_envs", None)
    _REGISTRY.pop("legacy_desk", None)


def test_an_import_path_builds_and_records_where_the_factory_lives(legacy):
    env = make("legacy_envs:Desk")
    assert env.spec == {"name": "legacy_envs:Desk", "kwargs": {}, "import": "legacy_envs:Desk"}


def test_a_receipt_rebuilds_an_env_whose_module_this_process_never_imported(legacy):
    recorded = {"name": "legacy_desk", "kwargs": {}, "import": "legacy_envs:Desk"}
    assert "legacy_envs" not in sys.modules
    env = make_from_spec(recorded, side_effect_guard="dry_run")
    assert type(env).__name__ == "Desk" and env.spec["name"] == "legacy_desk"
    with pytest.raises(NotFoundError, match="unknown environment 'gone'"):
        make_from_spec({"name": "gone", "kwargs": {}})


def test_unknown_names_list_the_valid_ones_and_say_how_to_add_one():
    with pytest.raises(NotFoundError) as e:
        resolve("refund_dsk")
    assert "did you mean 'refund_desk'?" in e.value.message
    assert "package.module:Class" in e.value.hint and "tracerl init" in e.value.hint
    with pytest.raises(UserError, match="not an environment class"):
        resolve("json:JSONDecoder")  # a class, not an Env
    with pytest.raises(UserError, match="returned dict, not an Env"):
        make("json:loads", s="{}")  # a function: what it returns is checked
    with pytest.raises(NotFoundError, match="has no attribute 'RefundDask'; did you mean"):
        resolve("tracerl.envs:RefundDask")


def test_the_factory_sent_to_workers_pickles_and_builds():
    factory = pickle.loads(pickle.dumps(env_factory("refund_desk")))
    assert factory().name == "refund_desk"
