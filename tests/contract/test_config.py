"""Config: YAML plus dotted overrides; bad input fails early, naming the field path."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.config import ConfigError
from tracerl.config.loading import load_config


def test_yaml_and_overrides(tmp_path):
    cfg = load_config(
        "configs/learn-arithmetic.yaml", ["trainer.lr=1e-4", "rollout.budgets.steps=2"]
    )
    assert cfg.model.spec == "tiny-chars" and cfg.trainer.lr == 1e-4
    assert cfg.rollout.budgets.steps == 2 and cfg.rollout.reserve is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.lrr=1", "unknown key 'trainer.lrr'; did you mean 'trainer.lr'?"),
        ("trainer.lr=fast", "trainer.lr: Input should be a valid number"),
        ("rollout.budgets.steps=0", "rollout.budgets.steps: Input should be greater than"),
        ("nonsense", "expected key.path=value"),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError) as e:
        load_config("configs/learn-arithmetic.yaml", [override])
    assert message in e.value.message


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.prefix_cache_gb=lots", 'model.prefix_cache_gb: expected float ≥ 0 or "auto"'),
        ("model.prefix_cache_gb=-1", 'model.prefix_cache_gb: expected float ≥ 0 or "auto"'),
        ("trainer.micro_batch_tokens=8", 'trainer.micro_batch_tokens: expected int ≥ 16 or "auto"'),
    ],
)
def test_a_value_that_fits_no_member_of_a_union_is_one_error_naming_the_type(override, message):
    """Not pydantic's error per member of ``float | "auto"`` under its internal names
    (``constrained-float``, ``literal['auto']``)."""
    with pytest.raises(ConfigError) as e:
        load_config("configs/learn-arithmetic.yaml", [override])
    assert message in e.value.message and "more:" not in e.value.message
    assert "literal" not in e.value.message and "constrained" not in e.value.message


def test_a_union_error_in_a_file_names_its_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nmodel:\n  spec: tiny-random\n  prefix_cache_gb: plenty\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.message == (
        f"{path}:4: model.prefix_cache_gb: expected float ≥ 0 or \"auto\" (got 'plenty')"
    )


def test_names_the_config_does_not_resolve_are_refused_with_the_valid_ones():
    from tracerl.preflight import prepare

    with pytest.raises(ConfigError) as e:
        prepare(load_config("configs/learn-arithmetic.yaml", ["trainer.reward=vibes"]))
    assert "trainer.reward: unknown reward 'vibes'" in e.value.message
    assert "arithmetic, coderepair, search" in e.value.message
    assert "package.module:function" in e.value.hint


def test_train_command_refuses_bad_config_before_loading_anything(tmp_path):
    result = CliRunner().invoke(app, ["train", "configs/learn-arithmetic.yaml", "trainer.lr=x"])
    assert result.exit_code == 2 and "trainer.lr" in result.output
    missing = CliRunner().invoke(app, ["train", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "no such config file" in missing.output


@pytest.mark.parametrize("path", ["configs/demo.yaml", "configs/learn-arithmetic.yaml"])
def test_shipped_configs_are_valid_and_their_env_builds(path):
    from tracerl.envs import get_parser, make
    from tracerl.preflight import prepare

    cfg = prepare(load_config(path)).cfg  # the environment's split defaults filled in
    env = make(cfg.env.name, **cfg.env.kwargs)
    if cfg.env.parser:
        get_parser(cfg.env.parser)
    tasks = env.sample_tasks(cfg.env.eval_tasks, split=cfg.env.eval_split)
    assert len(tasks) == cfg.env.eval_tasks  # the split is large enough
    if "max_hops" in cfg.env.kwargs:
        assert all(t["hops"] <= cfg.env.kwargs["max_hops"] for t in tasks)


def test_lora_and_warm_start_sections_validate():
    cfg = load_config(None, ["model.lora.r=8", "warm_start.tasks=4"])
    assert cfg.model.lora.r == 8 and cfg.model.lora.alpha == 32
    assert cfg.warm_start.tasks == 4 and cfg.warm_start.epochs == 1
    with pytest.raises(
        ConfigError, match=r"unknown key 'model\.lora\.rank'; did you mean 'model\.lora\.r'"
    ):
        load_config(None, ["model.lora.rank=8"])
    with pytest.raises(ConfigError, match=r"model\.dtype: Input should be"):
        load_config(None, ["model.dtype=fp8"])


def test_remote_sampling_settings_that_cannot_work_are_refused():
    base = "configs/learn-arithmetic.yaml"
    cases = {
        ("trainer.rollout.sampler_url=http://gpu:8000",): "needs trainer.rollout.backend=ray",
        (
            "trainer.rollout.backend=ray",
            "trainer.rollout.sampler_url=http://gpu:8000",
        ): "set model.lora",
        ("trainer.rollout.backend=ray", "trainer.rollout.served_model=m"): "without sampler_url",
    }
    for overrides, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config(base, list(overrides))
    ok = load_config(
        base,
        [
            "trainer.rollout.backend=ray",
            "trainer.rollout.sampler_url=http://gpu:8000",
            "trainer.rollout.weight_sync=mypkg.sync:factory",
        ],
    )
    assert ok.trainer.rollout.sampler_url == "http://gpu:8000"


def test_an_empty_importance_sampling_mask_range_is_refused():
    cfg = load_config(None, ["trainer.is_mask=sequence", "trainer.is_mask_high=3"])
    assert cfg.trainer.is_mask == "sequence" and cfg.trainer.is_mask_low == 0.5
    for low, high in (("2", "2"), ("3", "1.5")):
        with pytest.raises(
            ConfigError, match=r"trainer: is_mask_low \(\d.*\) must be below is_mask_high"
        ):
            load_config(None, [f"trainer.is_mask_low={low}", f"trainer.is_mask_high={high}"])
    with pytest.raises(ConfigError, match=r"trainer\.is_mask: Input should be"):
        load_config(None, ["trainer.is_mask=tokens"])


def test_a_misspelled_key_inside_a_mapping_of_sections_lists_that_sections_keys(tmp_path):
    """`env.mcp[].annotations` maps tool names to hints: a misspelled hint is told with the
    hints a tool may have, spelled as the MCP spec spells them and in snake_case."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: x\nenv:\n  name: arithmetic\n  mcp:\n    - name: kv\n"
        "      command: [python, -m, kv]\n      annotations:\n        get: {readOnly: true}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.message == (
        f"{path}:8: unknown key 'env.mcp.0.annotations.get.readOnly'; "
        "did you mean 'env.mcp.0.annotations.get.readOnlyHint'?"
    )
    assert e.value.hint.startswith(
        "valid keys of env.mcp.0.annotations.get: readOnlyHint, read_only_hint, destructiveHint"
    )
