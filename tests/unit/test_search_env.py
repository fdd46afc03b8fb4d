"""The search environment is solvable and demands search: an oracle that searches the gold
entities scores >= 0.95 on held-out questions; a guesser that never searches scores < 0.05."""

from __future__ import annotations

import asyncio

import pytest

from tracerl.envs import get_parser, make
from tracerl.envs.search import oracle_actions
from tracerl.envs.search import tasks as task_sets
from tracerl.rewards import exact_match, verify_citation
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.runner import Policy

CONFIG = RolloutConfig(budgets=Budgets(steps=6, tool_calls=6), reserve=None)


def _policy(tiny, env, tasks, protocol, *, guess=False):
    parser = get_parser("search_r1" if protocol == "search_r1" else "json_list")
    by_id = {t["id"]: t for t in tasks}

    def turn(request):
        task = by_id[request.episode_id.rsplit(":s", 1)[0]]
        if guess:
            return parser.format_answer("1900" if "year" in task["question"] else "Paris")
        texts = []
        for action in oracle_actions(env.corpus, task):
            call = action.tool_calls[0]
            if call.name == "answer":
                texts.append(
                    parser.format_answer(call.arguments["text"])
                    if protocol == "search_r1"
                    else parser.format_calls([("answer", call.arguments)])
                )
            else:
                texts.append(parser.format_calls([(call.name, call.arguments)]))
        return texts[min(request.turn, len(texts) - 1)]

    return Policy(ScriptedSampler.from_texts(tiny.renderer, turn), tiny.renderer, parser, "tiny")


def _score(env, tasks, episodes):
    em, cited, gain = [], [], []
    for task, e in zip(tasks, episodes, strict=True):
        info = next((s["info"] for s in e.steps if (s.get("info") or {}).get("answer")), None)
        answer = info["answer"] if info else {"text": "", "citations": []}
        em.append(exact_match(answer["text"], task["answers"]))
        cited.append(
            all(
                verify_citation(c, answer["text"], env.document)["valid"]
                for c in answer["citations"]
            )
            and bool(answer["citations"])
        )
        gain.append(sum(ev["evidence_gain"] for ev in e.receipt.ledger["events"]))
    n = len(tasks)
    return sum(em) / n, sum(cited) / n, sum(gain) / n


@pytest.mark.parametrize("corpus", ["synthetic", "wiki"])
def test_the_oracle_solves_heldout_questions_by_searching(tiny, corpus):
    env = make("search", corpus=corpus)
    tasks = task_sets.sample(corpus, "heldout", 60, seed=1)
    policy = _policy(tiny, env, tasks, "tools")
    groups = asyncio.run(
        run_groups(lambda: make("search", corpus=corpus), tasks, policy, CONFIG, group_size=1)
    )
    em, cited, gain = _score(env, tasks, [g[0] for g in groups])
    assert em >= 0.95 and cited >= 0.95, (em, cited)
    if corpus == "synthetic":
        assert gain >= 0.95  # searching the entities the question names finds their documents
    else:  # a subject asked by its description is searched by it: BM25 finds it 2 times in 3
        assert 0.5 <= gain < 0.95, gain
    assert all(g[0].stop_reason.value == "answered" for g in groups)
    # on wiki the reference agent searches what the question says, never the answer it asks
    for t in tasks if corpus == "wiki" else []:
        queries = [c.arguments["query"] for a in env.check_script(t)[:-1] for c in a.tool_calls]
        assert t["kind"] == "first_year" or t["answers"][0] not in queries, (t, queries)


def test_search_r1_protocol_and_a_guesser_that_never_searches(tiny):
    env = make("search", corpus="synthetic", protocol="search_r1")
    tasks = task_sets.sample("synthetic", "heldout", 60, seed=2)

    def run(policy):
        groups = asyncio.run(
            run_groups(
                lambda: make("search", corpus="synthetic", protocol="search_r1"),
                tasks,
                policy,
                CONFIG,
                group_size=1,
            )
        )
        return [g[0] for g in groups]

    oracle = run(_policy(tiny, env, tasks, "search_r1"))
    assert _score(env, tasks, oracle)[0] >= 0.95
    assert "<information>" in oracle[0].steps[0]["observation_messages"][0]["content"]
    guesser = run(_policy(tiny, env, tasks, "search_r1", guess=True))
    assert _score(env, tasks, guesser)[0] < 0.05
    assert all(len(e.steps) == 1 for e in guesser)


def test_splits_share_no_topic_and_no_gold_document():
    for corpus in ("synthetic", "wiki"):
        train, held = task_sets.split(corpus, "train"), task_sets.split(corpus, "heldout")
        assert len(held) >= 100 and len(train) > len(held)
        assert not {q["topic"] for q in train} & {q["topic"] for q in held}
        gold = [{d for q in s for d in q["gold_docs"]} for s in (train, held)]
        assert not gold[0] & gold[1]
    hops = {q["hops"] for q in task_sets.split("synthetic", "heldout")}
    assert hops == {1, 2, 3}


def test_a_search_r1_format_corpus_loads_and_is_searchable(tmp_path):
    import json

    from tracerl.envs.search import BM25Index, load_corpus

    path = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "0", "contents": '"Vellmor"\nVellmor is a river town known for glass.'},
        {"id": "1", "contents": '"Ostrak"\nOstrak is a mountain pass.'},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = load_corpus(f"jsonl:{path}")
    assert [d.title for d in corpus.docs] == ["Vellmor", "Ostrak"]
    assert corpus.docs[0].contents() == rows[0]["contents"]
    index = BM25Index(corpus, cache=tmp_path / "cache")
    assert [h.doc.id for h in index.search("glass town", 2)] == ["0"]
    assert BM25Index(corpus, cache=tmp_path / "cache").origin == "cache"
    path.write_text('{"id": "0", "text": "no contents"}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl:1: expected"):
        load_corpus(f"jsonl:{path}")


def test_search_tools_dead_links_and_evidence_gain(tiny):
    env = make("search", corpus="synthetic")
    task = task_sets.sample("synthetic", "train", 1, seed=5)[0]
    asyncio.run(env.reset(task, 0))
    gold = env.corpus.by_id[task["gold_docs"][0]]
    first = asyncio.run(env.search({"query": gold.title}))
    again = asyncio.run(env.search({"query": gold.title}))
    assert gold.id in first.content and first.evidence_gain > 0
    assert again.evidence_gain == 0.0  # a repeated search surfaces nothing new
    dead = asyncio.run(env.open_doc({"doc_id": "syn:person:99.99"}))
    assert dead.error.kind.value == "invalid_arguments" and "dead link" in dead.content
    opened = asyncio.run(env.open_doc({"doc_id": gold.id}))
    assert opened.content.startswith(gold.title + "\n")


def test_verl_parquet_round_trip(tmp_path):
    import pyarrow.parquet as pq

    from tracerl.envs.search.verl import export_parquet, import_parquet

    tasks = task_sets.sample("synthetic", "heldout", 5, seed=0)
    path = export_parquet(tasks, tmp_path / "heldout.parquet")
    table = pq.read_table(path)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    row = table.to_pylist()[0]
    assert row["data_source"] == "tracerl_synthetic" and row["ability"] == "fact-reasoning"
    assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": tasks[0]["answers"]}}
    assert row["prompt"] == [{"role": "user", "content": tasks[0]["question"]}]
    back = import_parquet(path)
    for a, b in zip(tasks, back, strict=True):
        assert {k: a[k] for k in ("id", "question", "answers", "gold_docs", "hops", "topic")} == {
            k: b[k] for k in ("id", "question", "answers", "gold_docs", "hops", "topic")
        }
    # Search-R1's own rows (no tracerl fields) import too
    foreign = tmp_path / "nq.parquet"
    import pyarrow as pa

    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "data_source": "nq",
                    "prompt": [{"role": "user", "content": "who wrote hamlet?"}],
                    "ability": "fact-reasoning",
                    "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
                    "extra_info": {"split": "test", "index": 7},
                }
            ]
        ),
        foreign,
    )
    (task,) = import_parquet(foreign)
    assert task == {
        "id": "nq:7",
        "question": "who wrote hamlet?",
        "answers": ["Shakespeare"],
        "gold_docs": [],
        "split": "test",
    }


def test_the_adversarial_split_is_labelled_and_the_oracle_survives_it(tiny, tmp_path):
    """Every trap kind is present, in held-out topics; an oracle that searches the exact
    subject still answers, and per-kind success is reported."""
    from tracerl.evaluate import evaluate

    cases = task_sets.split("synthetic", "adversarial")
    assert {q["kind"] for q in cases} == {"look_alike", "dead_link", "conflict", "timeout"}
    held = task_sets.heldout_topics("synthetic")
    assert all(q["topic"] in held for q in cases)
    env = make("search", corpus="synthetic")
    look = env.corpus.by_id[f"adv:look:{cases[0]['gold_docs'][0]}"]
    assert look.title != env.corpus.by_id[cases[0]["gold_docs"][0]].title  # one letter off
    policy = _policy(tiny, env, list(cases), "tools")
    metrics = evaluate(policy, splits=("adversarial",), n=len(cases), out_dir=tmp_path)
    for kind in ("look_alike", "dead_link", "conflict"):
        assert metrics[f"eval/adversarial/{kind}/success_rate"] == 1.0
    # timeouts: retried away, or the episode is the environment's (never a wrong answer)
    assert metrics["eval/adversarial/timeout/success_rate"] >= 0.5
    assert metrics["eval/adversarial/attribution/episodes_environment"] <= 0.25


def test_wiki_questions_cannot_be_passed_without_the_gold_document():
    """No answer is spelled in its question, and no gold title is (after normalisation)
    another document's title ("Centaurus" vs "Centaurus A")."""
    from tracerl.rewards import normalize

    questions = task_sets.questions("wiki")
    titles: dict[str, int] = {}
    for d in make("search", corpus="wiki").corpus.docs:
        titles[normalize(d.title)] = titles.get(normalize(d.title), 0) + 1
    for q in questions:
        gold = normalize(q["answers"][0])
        assert f" {gold} " not in f" {normalize(q['question'])} ", q
        if q["kind"] != "first_year":
            assert titles.get(gold, 0) <= 1, q
    assert not any(q["answers"] == ["Centaurus A"] for q in questions)
    years = [q for q in questions if q["kind"] == "first_year"]
    assert len(years) > 300 and all(1000 <= int(q["answers"][0]) <= 2029 for q in years)
