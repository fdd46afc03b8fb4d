"""Config: YAML plus dotted overrides; bad input fails early, naming the field path."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.config import ConfigError, load_config


def test_yaml_and_overrides(tmp_path):
    cfg = load_config(
        "configs/learn-arithmetic.yaml", ["trainer.lr=1e-4", "rollout.budgets.steps=2"]
    )
    assert cfg.model.spec == "tiny-chars" and cfg.trainer.lr == 1e-4
    assert cfg.rollout.budgets.steps == 2 and cfg.rollout.reserve is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.lrr=1", "trainer.lrr: Extra inputs are not permitted"),
        ("trainer.lr=fast", "trainer.lr: Input should be a valid number"),
        ("rollout.budgets.steps=0", "rollout.budgets.steps: Input should be greater than"),
        ("trainer.reward=vibes", "trainer.reward: Input should be 'search' or 'arithmetic'"),
        ("nonsense", "expected key.path=value"),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config("configs/learn-arithmetic.yaml", [override])


def test_train_command_refuses_bad_config_before_loading_anything(tmp_path):
    result = CliRunner().invoke(app, ["train", "configs/learn-arithmetic.yaml", "trainer.lr=x"])
    assert result.exit_code == 2 and "trainer.lr" in result.output
    missing = CliRunner().invoke(app, ["train", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "no such config file" in missing.output
