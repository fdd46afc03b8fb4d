"""A warm start whose reference agent succeeds on no task names whose failure its episodes
were (the environment's, the reward's, the reference's own) and their most common fault,
with what to do for that owner; its episodes are set aside so a resume plays it again."""

from __future__ import annotations

from types import SimpleNamespace

from tracerl.errors import UserError
from tracerl.rollout.persist import EpisodeWriter, step_file
from tracerl.train.warm_start import WarmStartFailed, no_success, set_aside
from tracerl.types import Attribution, RewardBreakdown, Segment, Source, StopReason, Trajectory


def _trajectory(episode_id: str) -> Trajectory:
    segments = (Segment(Source.PROMPT, (1, 2)), Segment(Source.POLICY, (3,), (-0.5,)))
    return Trajectory(segments=segments, episode_id=episode_id)


def _episode(reward, attribution, stop, error=None):
    return SimpleNamespace(
        reward=reward,
        attribution=attribution,
        gradient_eligible=attribution is Attribution.POLICY,
        stop_reason=stop,
        receipt=SimpleNamespace(error=error),
    )


def _outage(error="reset failed: ConnectionError: MCP server 'files' exited (code 1)"):
    return _episode(
        RewardBreakdown.scalar(0.0, Attribution.ENVIRONMENT),
        Attribution.ENVIRONMENT,
        StopReason.INFRA_FAILURE,
        error,
    )


def _wrong(stop=StopReason.ANSWERED):
    return _episode(RewardBreakdown.scalar(0.0, Attribution.POLICY), Attribution.POLICY, stop)


def test_the_environments_failure_is_named_with_its_fault_and_a_hint_for_the_environment():
    e = no_success([_outage(), _outage(), _outage("TimeoutError: reset took 30 s")], "runs/x")
    assert isinstance(e, UserError) and isinstance(e, RuntimeError)  # its old base kept
    assert isinstance(e, WarmStartFailed) and e.owner is Attribution.ENVIRONMENT
    assert e.message == (
        "warm start: the reference agent succeeded on none of 3 tasks (3 of 3 were the "
        "environment's failure: reset failed: ConnectionError: MCP server 'files' exited "
        "(code 1))"
    )
    assert "the environment (or a tool server it uses) failed" in e.hint
    assert "tracerl triage runs/x" in e.hint and "--resume" in e.hint
    assert "check_script" not in e.hint  # not the script's fault


def test_the_references_own_failure_points_at_the_check_script():
    e = no_success([_wrong(), _wrong(), _outage()], "runs/x")
    assert e.owner is Attribution.POLICY
    assert "(2 of 3 were the reference's own failure in a healthy environment: " in e.message
    assert "stopped: answered, reward 0)" in e.message
    assert "check_script does not solve its tasks" in e.hint
    assert "tracerl check-env --config runs/x/config.yaml" in e.hint


def test_a_reference_out_of_budget_is_told_to_get_more_budget():
    e = no_success([_wrong(StopReason.MAX_TOKENS)], "runs/x")
    assert "stopped: max_tokens, reward 0" in e.message
    assert "ran out of its budget" in e.hint and "rollout.max_turn_tokens" in e.hint


def test_a_crashed_reward_is_the_evaluators():
    crashed = _episode(
        RewardBreakdown.crashed("TypeError: unsupported operand"),
        Attribution.POLICY,
        StopReason.ANSWERED,
    )
    e = no_success([crashed], "runs/x")
    assert e.owner is Attribution.EVALUATOR
    assert "were the evaluator's failure (the reward decided nothing): TypeError" in e.message
    assert "the reward could not score" in e.hint


def test_no_task_at_all_says_so():
    e = no_success([], "runs/x")
    assert "gave no training task" in e.message and "warm_start: null" in e.hint


def test_set_aside_keeps_the_episodes_where_a_resume_does_not_reuse_them(tmp_path):
    assert set_aside(tmp_path) is None  # nothing written: nothing to move
    for n in (1, 2):
        EpisodeWriter(tmp_path / "warm_start", 0).append([_trajectory(f"e{n}")])
        moved = set_aside(tmp_path)
        assert moved == step_file(tmp_path / "warm_start" / f"failed_{n}", 0)
        assert moved.is_file() and not step_file(tmp_path / "warm_start", 0).exists()
