"""`tracerl.train`'s config from Python (`tracerl.train.configure`): a YAML path, a dict, a
RunConfig or keyword sections mean one config; objects become import paths when they can be
found again, and ``python:`` names registered for this process when not; mistakes read as the
command line's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracerl.config import ConfigError, RunConfig
from tracerl.config.loading import load_config
from tracerl.envs.arithmetic import Arithmetic
from tracerl.envs.registry import resolve
from tracerl.errors import NotFoundError, UserError
from tracerl.rewards.resolve import resolve_reward
from tracerl.train.configure import python_objects_note, run_config

ARITHMETIC = Path(__file__).parents[2] / "configs/learn-arithmetic.yaml"


@pytest.fixture(autouse=True)
def _own_registries(monkeypatch):
    """What a test registers stays its own (``tracerl list`` and "did you mean" elsewhere
    list the registered names)."""
    from tracerl.envs import registry
    from tracerl.rewards import resolve as rewards

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(rewards, "_OBJECTS", dict(rewards._OBJECTS))


class ModuleEnv(Arithmetic):
    """Found again by import path: ``tests.unit.test_api_config:ModuleEnv``."""


def module_reward(completion: str) -> float:
    return float(bool(completion))


def test_a_yaml_path_a_dict_a_run_config_and_keywords_make_one_config():
    from_yaml = run_config(ARITHMETIC, trainer={"steps": 3}, overrides=["trainer.lr=0.5"])
    as_dict = load_config(ARITHMETIC).model_dump(mode="json")
    from_dict = run_config(as_dict, overrides={"trainer.steps": 3, "trainer.lr": 0.5})
    from_model = run_config(load_config(ARITHMETIC), trainer={"steps": 3, "lr": 0.5})
    cli = load_config(ARITHMETIC, ["trainer.steps=3", "trainer.lr=0.5"])
    assert from_yaml == from_dict == from_model == cli
    assert cli.trainer.steps == 3 and cli.model.spec == "tiny-chars"
    # later wins: config < keyword sections < overrides; sections merge, never replace
    cfg = run_config(ARITHMETIC, env={"eval_tasks": 3}, overrides=["env.eval_tasks=5"])
    assert cfg.env.eval_tasks == 5 and cfg.env.name == "arithmetic"
    # shorthands: a model spec, an environment name; tiny floats survive the round trip
    cfg = run_config(model="tiny-chars", env="arithmetic", trainer={"lr": 1e-7}, out_dir=Path("x"))
    assert cfg.model.spec == "tiny-chars" and cfg.env.name == "arithmetic"
    assert cfg.trainer.lr == 1e-7 and cfg.out_dir == "x"


def test_an_unknown_key_reads_as_the_command_lines_error():
    with pytest.raises(ConfigError) as cli:
        load_config(None, ["trainer.stepz=3"])
    with pytest.raises(ConfigError) as api:
        run_config(trainer={"stepz": 3})
    assert str(api.value) == str(cli.value)
    assert "unknown key 'trainer.stepz'; did you mean 'trainer.steps'?" in str(api.value)
    assert api.value.hint == cli.value.hint
    with pytest.raises(ConfigError, match=r"trainer\.steps: .*got -1"):
        run_config(overrides={"trainer.steps": -1})
    with pytest.raises(ConfigError, match="cannot go into a config"):
        run_config(env={"kwargs": {"x": object()}})
    with pytest.raises(ConfigError, match="expected a RunConfig, a dict or a YAML path"):
        run_config(3)


def test_importable_objects_are_written_as_their_import_path():
    cfg = run_config(env=ModuleEnv, reward=module_reward)
    assert cfg.env.name == "tests.unit.test_api_config:ModuleEnv"
    assert cfg.trainer.reward == "tests.unit.test_api_config:module_reward"
    assert python_objects_note(cfg) == ""  # nothing only this process can find


def test_other_objects_are_registered_for_this_process_under_python_names():
    class LocalEnv(Arithmetic):
        pass

    def local_reward(completion: str) -> float:
        return 0.5

    cfg = run_config(env={"name": LocalEnv, "eval_tasks": 2}, reward=local_reward)
    assert cfg.env.name == f"python:{LocalEnv.__qualname__}"
    assert cfg.trainer.reward == f"python:{local_reward.__qualname__}"
    assert resolve(cfg.env.name).factory is LocalEnv
    reward = resolve_reward(cfg.trainer.reward, None, LocalEnv())
    assert [c.name for c in reward.spec.components] == ["attribution", "local_reward"]
    note = python_objects_note(cfg)
    assert note.startswith("# env.name: python:") and "tracerl.train(" in note
    assert all(line.startswith("# ") for line in note.splitlines())
    # the same object again: the same name; another object of that name: another name
    assert run_config(env=LocalEnv).env.name == cfg.env.name

    class Redefined(Arithmetic):  # a notebook cell run again
        pass

    Redefined.__qualname__ = LocalEnv.__qualname__
    assert run_config(env=Redefined).env.name == cfg.env.name + "#2"
    # a factory, a callable object, components whose fn is a function
    made = run_config(env=lambda: LocalEnv()).env.name
    assert made.startswith("python:") and made.endswith("<lambda>")

    class Tolerance:
        def __call__(self, completion: str) -> float:
            return 1.0

    assert run_config(reward=Tolerance()).trainer.reward.startswith("python:")
    components = [{"name": "mine", "fn": local_reward, "layer": "outcome"}]
    cfg = run_config(ARITHMETIC, reward=components)
    assert cfg.trainer.reward is None  # the run's reward is the one given
    assert cfg.trainer.reward_components[0].fn == f"python:{local_reward.__qualname__}"


def test_objects_that_cannot_be_an_environment_or_a_reward_are_refused():
    with pytest.raises(UserError, match="fresh environment for every episode"):
        run_config(env=Arithmetic())
    with pytest.raises(UserError, match="not an environment class"):
        run_config(env=dict)
    with pytest.raises(UserError, match="expected a name, a function"):
        run_config(reward=Arithmetic)
    with pytest.raises(ConfigError, match="both given"):
        run_config(reward="arithmetic", trainer={"reward": "search"})


def test_ray_workers_cannot_build_an_environment_of_this_process():
    class Local(Arithmetic):
        pass

    with pytest.raises(ConfigError, match="Ray workers build environments"):
        run_config(env=Local, trainer={"rollout": {"backend": "ray"}})
    ok = run_config(env=ModuleEnv, trainer={"rollout": {"backend": "ray"}})
    assert ok.trainer.rollout.backend == "ray"


def test_a_python_name_this_process_does_not_have_says_how_to_give_it_again():
    with pytest.raises(NotFoundError) as env:
        resolve("python:Gone")
    assert "given to tracerl.train()" in str(env.value)
    assert "env=YourEnv, resume=True" in env.value.hint
    with pytest.raises(NotFoundError) as reward:
        resolve_reward("python:gone", None, Arithmetic())
    assert "trainer.reward 'python:gone'" in str(reward.value)
    assert "reward=your_function" in reward.value.hint
    components = [{"name": "x", "fn": "python:gone", "layer": "outcome"}]
    with pytest.raises(NotFoundError, match=r"given to tracerl\.train"):
        resolve_reward(None, components, Arithmetic())


def test_run_from_config_checks_and_hints(tmp_path):
    """`tracerl.Run.from_config` checks what `tracerl train` checks, names the file as it
    does, and attaches the hint to the exception for a traceback; a RunConfig alone is the
    old call."""
    import tracerl
    from tracerl.train.run import Run

    with pytest.raises(ConfigError) as e:
        tracerl.Run.from_config(ARITHMETIC, env={"eval_split": "nope"})
    assert str(e.value).startswith(f"{ARITHMETIC}: env.eval_split")
    assert e.value.hint in e.value.__notes__
    cfg = load_config(ARITHMETIC, [f"out_dir={tmp_path}"])
    assert isinstance(Run.from_config(cfg).cfg, RunConfig)
    run = tracerl.Run.from_config(cfg, trainer={"steps": 1})
    assert isinstance(run, tracerl.Run) and run.cfg.trainer.steps == 1
