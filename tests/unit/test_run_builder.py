"""One config, one run: every command builds it through `tracerl.train.run.Run`, the same way.

Each entry point is run for real on a tiny config (sync and async training, `tracerl eval
CONFIG`, `tracerl readiness`, a learner rank under a launch, `tracerl demo`'s model) while
every `Run` it builds is recorded with what it built (`Run.describe`: the model's weights,
the sampler's settings, the learner's, the environment, the reward, step 0's tasks). They
must all be the same, and what they describe must be what the config says.
"""

from __future__ import annotations

import pytest

from tracerl.config.loading import load_config
from tracerl.preflight import prepare
from tracerl.train.run import Run

SMALL = [
    "trainer.steps=1",
    "trainer.group_size=2",
    "env.tasks_per_step=2",
    "env.eval_tasks=2",
    "trainer.eval_every=0",
]


@pytest.fixture
def built(monkeypatch):
    """Every `Run` made while the test runs, described as it was built (before training
    changes the weights)."""
    made: list[dict] = []
    init = Run.__init__

    def recording(self, prepared):
        init(self, prepared)
        made.append(self.describe())

    monkeypatch.setattr(Run, "__init__", recording)
    return made


def _cfg(tmp_path, *extra):
    return load_config("configs/learn-arithmetic.yaml", [f"out_dir={tmp_path}", *SMALL, *extra])


def test_every_command_builds_a_config_the_same_way(tmp_path, built, monkeypatch):
    from typer.testing import CliRunner

    from tracerl.cli import app
    from tracerl.readiness.run import readiness_from_config
    from tracerl.train.distributed import group
    from tracerl.train.distributed.ranks import Ranks
    from tracerl.train.evaluation import evaluate_config
    from tracerl.train.loop import train

    seen: dict[str, int] = {}

    def mark(name):
        seen[name] = len(built)

    train(_cfg(tmp_path / "sync"), log=lambda _: None)
    mark("train (sync)")
    train(_cfg(tmp_path / "async", "trainer.mode=async"), log=lambda _: None)
    mark("train (async)")
    evaluate_config(prepare(_cfg(tmp_path)), tmp_path / "eval", n=2)
    mark("eval CONFIG")
    readiness_from_config(_cfg(tmp_path), episodes=4)
    mark("readiness")

    # a learner rank: `tracerl train` in a launch whose rank is 1 builds its model, then
    # follows rank 0's calls (here: stop at once)
    class Stop:
        def receive(self):
            return "stop", ()

    calls, follow_for_real = [], group.follow

    def follow(run, log=print):
        calls.append(run)
        follow_for_real(run, log)

    monkeypatch.setattr(group, "_current", [group.Launch(Ranks(1, 2), "ddp", Stop())])
    monkeypatch.setattr(group, "follow", follow)
    args = ["train", "configs/learn-arithmetic.yaml", f"out_dir={tmp_path}/rank1", *SMALL]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert len(calls) == 1 and not (tmp_path / "rank1").exists()  # a rank writes no run
    mark("learner rank")

    assert list(seen.values()) == [1, 2, 3, 4, 5], seen  # one Run per command
    first = built[0]
    for name, n in seen.items():
        assert built[n - 1] == first, name

    # and what they built is what the config says; another config builds another run
    cfg = _cfg(tmp_path)
    assert first["model"] == "tiny-chars" and first["reward"] == "trainer.reward: arithmetic"
    assert first["sampler"] == [1.0, cfg.trainer.seed, cfg.model.max_batch_size]
    assert len(first["tasks"]) == 2
    other = Run(prepare(_cfg(tmp_path, "trainer.seed=1", "model.temperature=0.5"))).describe()
    assert other["sampler"][:2] == [0.5, 1] and other["tasks"] != first["tasks"]
    assert other["learner"] != first["learner"]  # the learner samples at the temperature


def test_the_demo_builds_its_model_and_environment_as_a_run(tmp_path, built, monkeypatch):
    """`tracerl demo` (here on the tiny model) samples from the run its config builds."""
    import io

    from rich.console import Console

    from tracerl import demo

    cfg = demo.DEMO_RUN.model_copy(
        update={"model": demo.DEMO_RUN.model.model_copy(update={"spec": "tiny-chars"})}
    )
    monkeypatch.setattr(demo, "DEMO_RUN", cfg)
    demo.main(str(tmp_path), Console(file=io.StringIO()))
    assert len(built) == 1
    assert built[0]["sampler"] == [demo.TEMPERATURE, 7, 16] and built[0]["model"] == "tiny-chars"
    assert built[0]["reward"] is None and built[0]["tasks"] is None  # it scores nothing
