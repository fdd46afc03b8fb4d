"""veRL parquet rows and task files: a value may be a plain string where tracerl writes JSON
text (veRL and Search-R1 datasets store `extra_info` as a struct of plain values); a row with
no question or no answers is refused naming the file, the row and the field. The search
environment trains on a task file (``env.kwargs.tasks``), one per split if need be."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.command import run_tracerl
from tracerl.envs import make
from tracerl.envs.search import tasks as task_sets
from tracerl.envs.search.task_files import load_tasks
from tracerl.envs.search.verl import DatasetError, export_parquet, import_parquet
from tracerl.errors import UserError

ROW = {
    "data_source": "nq",
    "prompt": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "who wrote hamlet?"},
    ],
    "ability": "fact-reasoning",
    "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
    "extra_info": {"split": "train", "index": 7},
}


def _parquet(path: Path, *rows: dict) -> Path:
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


def test_plain_strings_in_extra_info_are_taken_as_they_are(tmp_path):
    extra = {
        "split": "train",
        "index": 0,
        "id": "nq_train_0",  # not JSON text: the old importer raised JSONDecodeError
        "topic": "Literature",
        "kind": "123",  # JSON text of a number, in a text field: stays text
        "gold_docs": "wiki:Hamlet",
        "hops": 2,
    }
    (task,) = import_parquet(_parquet(tmp_path / "d.parquet", {**ROW, "extra_info": extra}))
    assert task["id"] == "nq_train_0" and task["topic"] == "Literature" and task["kind"] == "123"
    assert task["gold_docs"] == ["wiki:Hamlet"] and task["hops"] == 2
    assert task["question"] == "who wrote hamlet?"  # the last user message, past the system's


def test_a_ground_truth_that_is_the_answer_itself_is_one_answer(tmp_path):
    row = {**ROW, "reward_model": {"style": "rule", "ground_truth": "Shakespeare"}}
    (task,) = import_parquet(_parquet(tmp_path / "d.parquet", row))
    assert task["answers"] == ["Shakespeare"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"prompt": [{"role": "system", "content": "Answer briefly."}]},
            "row 1: prompt holds no user message (roles: system), so no question",
        ),
        (
            {"reward_model": {"style": "rule", "ground_truth": {"target": []}}},
            "row 1: reward_model.ground_truth.target is [], not the answers",
        ),
        (
            {"extra_info": {"split": "train", "index": 1, "hops": "many"}},
            "row 1: extra_info.hops is 'many', not a number of hops",
        ),
    ],
)
def test_a_malformed_row_is_refused_naming_the_file_the_row_and_the_field(tmp_path, change, says):
    path = _parquet(tmp_path / "d.parquet", ROW, {**ROW, **change})
    with pytest.raises(DatasetError) as e:
        import_parquet(path)
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)
    assert e.value.message.startswith(f"{path}: {says}"), e.value.message
    assert "reward_model.ground_truth.target" in e.value.hint


def test_the_search_env_trains_on_a_task_file_per_split(tmp_path):
    train = export_parquet(
        task_sets.sample("synthetic", "train", 6, seed=0), tmp_path / "t.parquet"
    )
    test = _parquet(tmp_path / "nq.parquet", ROW, {**ROW, "extra_info": {"index": 8}})
    env = make("search", corpus="synthetic", tasks={"train": str(train), "test": str(test)})
    assert env.splits == ("train", "test")
    drawn = env.sample_tasks(4, seed=1, split="train")
    assert len(drawn) == 4 and all(t["split"] == "train" and t["gold_docs"] for t in drawn)
    assert drawn == env.sample_tasks(4, seed=1, split="train")  # deterministic in the seed
    held = env.sample_tasks(5, split="test")
    assert sorted(t["id"] for t in held) == ["nq:7", "nq:8"]
    with pytest.raises(KeyError, match="unknown split 'heldout'"):
        env.sample_tasks(1, split="heldout")
    # the reference for a question whose gold documents the corpus lacks: search the
    # question, then answer
    script = env.check_script(held[0])
    assert [c.name for a in script for c in a.tool_calls] == ["search", "answer"]
    assert script[-1].tool_calls[0].arguments["text"] == "Shakespeare"
    # one file: each row's own split (none: train)
    assert list(load_tasks(str(test))) == ["train"]


def test_a_jsonl_task_file_names_the_line_of_a_bad_task(tmp_path):
    good = {"question": "who wrote hamlet?", "answers": "Shakespeare", "split": "test"}
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"question": "?", "answers": 3}) + "\n")
    with pytest.raises(DatasetError, match=r"q\.jsonl:3: answers is 3, not a list of strings"):
        load_tasks(str(path))
    path.write_text(json.dumps(good) + "\n")
    (task,) = load_tasks(str(path))["test"]
    assert task["answers"] == ["Shakespeare"] and task["id"] == "q:1"


def test_a_config_whose_task_file_has_a_bad_row_is_two_lines_and_writes_nothing(tmp_path):
    path = _parquet(tmp_path / "d.parquet", {**ROW, "prompt": [ROW["prompt"][0]]})
    args = [
        "train",
        "env.name=search",
        f"env.kwargs={{corpus: synthetic, tasks: {path}}}",
        "model.spec=tiny-chars",
        f"out_dir={tmp_path / 'runs'}",
    ]
    r = run_tracerl(args, tmp_path, tmp_path / "cache")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert len(lines) == 2, r.stderr
    assert lines[0] == (
        f"error: env.kwargs: {path}: row 0: prompt holds no user message (roles: system), "
        "so no question"
    )
    assert not (tmp_path / "runs").exists()


def test_the_exported_file_still_round_trips(tmp_path):
    tasks = task_sets.sample("synthetic", "heldout", 3, seed=0)
    back = import_parquet(export_parquet(tasks, tmp_path / "h.parquet"))
    keys = ("id", "question", "answers", "gold_docs", "hops", "topic")
    assert [{k: t[k] for k in keys} for t in back] == [{k: t[k] for k in keys} for t in tasks]
