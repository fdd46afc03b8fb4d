"""`timeline`'s reference agent, as the warm start plays it: each call after the first notes
the year of the article just read, the summary carries the years so far, and a sub-agent's
script opens its own range without notes (its context holds all its articles)."""

from __future__ import annotations

import asyncio

from tracerl.envs import make
from tracerl.envs.parsers import get_parser
from tracerl.envs.timeline import years_of
from tracerl.rollout.reference import reference_texts


def test_each_open_after_the_first_notes_the_year_just_read_and_still_parses() -> None:
    env = make("timeline", pages=4)
    task = env.sample_tasks(1, seed=3)[0]
    parser = get_parser("json_list")
    texts = reference_texts(env, task, parser)
    assert len(texts) == 5  # four opens, one answer
    actions = [parser.parse(t, step=i) for i, t in enumerate(texts)]
    assert [a.tool_calls[0].arguments["n"] for a in actions[:4]] == [1, 2, 3, 4]
    assert not texts[0].split("<tool_call>")[0].strip()  # nothing read yet: no note
    for k in (1, 2, 3):  # the turn after article k opens k + 1 and notes k's year first
        assert texts[k].startswith(f"{k}: {task['years'][k - 1]}\n<tool_call>")
    assert actions[4].answer is not None and years_of(actions[4].answer) == task["years"]


def test_summaries_and_sub_agents_carry_the_years_read_so_far() -> None:
    env = make("timeline", pages=4, delegate=True)
    task = env.sample_tasks(1, seed=5)[0]
    y = task["years"]
    assert env.check_summary(task, 2) == f"Years of articles 1-2 of 4: {y[0]} {y[1]}."
    assert env.check_summary(task, 4) == f"Years of articles 1-4 of 4: {' '.join(y)}."
    env.task = task  # the last article says so: the cue to answer
    assert asyncio.run(env.open_article({"n": 4})).content.startswith("Article 4 of 4, the last: ")
    assert asyncio.run(env.open_article({"n": 3})).content.startswith("Article 3 of 4: ")
    parser = get_parser("json_list")
    second = reference_texts(env, task, parser, child=1)  # articles 3 and 4, no notes
    assert [t.startswith("<tool_call>") for t in second] == [True, True, False]
    assert years_of(second[2]) == y[2:]


def test_the_parent_sees_which_articles_a_sub_agents_answer_covers() -> None:
    env = make("timeline", pages=8, delegate=True)
    task = env.sample_tasks(1, seed=2)[0]
    first = env.subagent_result(task, env._subtask(1, 4), "1900 1901 1902 1903")
    last = env.subagent_result(task, env._subtask(5, 8), "1904 1905")
    assert first == "Articles 1-4 of 8: 1900 1901 1902 1903"
    assert last == "Articles 5-8 of 8, the last: 1904 1905"  # the cue to answer, as open's
    # a sub-task that names no range of this task's articles: the answer, as written
    assert env.subagent_result(task, "Find the years.", "1900") == "1900"
    assert env.subagent_result(task, "Open articles 7 to 12.", "1900") == "1900"
