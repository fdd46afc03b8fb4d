"""The review pool: near misses wait for a person; verdicts flow into the metrics."""

from __future__ import annotations

from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.envs import get_parser, make
from tracerl.envs.search import tasks as task_sets
from tracerl.evaluate import evaluate
from tracerl.rewards.review import ReviewPool
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.runner import Policy


def _near_miss_policy(tiny, tasks):
    """Answers "<gold> indeed" (F1 0.67 against the gold): no rule can call it right or wrong."""
    parser, by_id = get_parser("json_list"), {t["id"]: t for t in tasks}

    def turn(request):
        task = by_id[request.episode_id.rsplit(":s", 1)[0]]
        return parser.format_calls([("answer", {"text": f"{task['answers'][0]} indeed"})])

    return Policy(ScriptedSampler.from_texts(tiny.renderer, turn), tiny.renderer, parser, "t")


def test_undecided_answers_go_to_review_and_verdicts_count(tiny, tmp_path):
    tasks = make("search", corpus="synthetic").sample_tasks(3, split="heldout")
    assert tasks == task_sets.sample("synthetic", "heldout", 3)
    run = tmp_path / "eval"
    m = evaluate(_near_miss_policy(tiny, tasks), n=3, out_dir=run)
    assert m["eval/heldout/undecided_rate"] == 1.0 and m["eval/heldout/review_pending"] == 3
    # nothing decided: no success rate at all (undefined), never a 0
    assert "eval/heldout/success_rate" not in m and "eval/heldout/reward_mean" not in m
    assert "eval/heldout/reviewed_success_rate" not in m
    listed = CliRunner().invoke(app, ["review", str(run)])
    assert listed.exit_code == 0 and "3 pending" in listed.stdout and "indeed" in listed.stdout
    assert "reviewed_success_rate" in listed.stdout and "undefined" in listed.stdout
    first, second = ReviewPool(run / "review.sqlite").samples()[:2]
    ok = CliRunner().invoke(
        app, ["review", str(run), "--decide", str(first.id), "--correct", "--reviewer", "ana"]
    )
    assert ok.exit_code == 0 and "correct by ana" in ok.stdout and "2 pending" in ok.stdout
    # over the answers someone decided (the pending ones are no failures): 1 of 1
    assert "eval/heldout/reviewed_success_rate" in ok.stdout and "1.000" in ok.stdout
    wrong = CliRunner().invoke(
        app, ["review", str(run), "--decide", str(second.id), "--wrong", "--reviewer", "ana"]
    )
    assert wrong.exit_code == 0 and "1 pending" in wrong.stdout and "0.500" in wrong.stdout
    # A later evaluation of the same answers takes the verdicts instead of asking again.
    again = evaluate(_near_miss_policy(tiny, tasks), n=3, out_dir=run)
    assert again["eval/heldout/review_pending"] == 1
    assert abs(again["eval/heldout/reviewed_success_rate"] - 1 / 2) < 1e-9
    bad = CliRunner().invoke(
        app, ["review", str(run), "--decide", "99", "--wrong", "--reviewer", "ana"]
    )
    assert bad.exit_code == 2 and "no review sample 99" in bad.output
    anonymous = CliRunner().invoke(app, ["review", str(run), "--decide", "1", "--wrong"])
    assert anonymous.exit_code == 2 and "--reviewer" in anonymous.output
