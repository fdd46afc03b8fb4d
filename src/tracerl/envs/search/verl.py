"""Datasets in veRL's parquet schema, so they move between tracerl and veRL/Search-R1 as is.

One row per question:

    data_source   "tracerl_<corpus>" (Search-R1 uses "nq", "hotpotqa", ...)
    prompt        chat messages: [{"role": "user", "content": ...}]
    ability       "fact-reasoning"
    reward_model  {"style": "rule", "ground_truth": {"target": [answers...]}}
    extra_info    {"split", "index", and tracerl's fields: id, gold_docs, hops, topic, kind}

Import reads any file with that schema (Search-R1's own processed data included): the
question is the last user message, the answers are ``ground_truth.target``; tracerl's fields
come back when present.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ABILITY = "fact-reasoning"
_EXTRA = ("id", "gold_docs", "hops", "topic", "kind", "corpus")


def to_verl_rows(tasks: list[dict[str, Any]], prompt_prefix: str = "") -> list[dict[str, Any]]:
    rows = []
    for i, t in enumerate(tasks):
        extra = {"split": t.get("split", ""), "index": i}
        # nested values as JSON text: parquet struct columns must share one type per field
        extra.update({k: json.dumps(t[k]) for k in _EXTRA if k in t})
        rows.append(
            {
                "data_source": f"tracerl_{t.get('corpus', 'search')}",
                "prompt": [{"role": "user", "content": prompt_prefix + t["question"]}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": {"target": list(t["answers"])}},
                "extra_info": extra,
            }
        )
    return rows


def export_parquet(
    tasks: list[dict[str, Any]], path: str | os.PathLike[str], prompt_prefix: str = ""
) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(pa.Table.from_pylist(to_verl_rows(tasks, prompt_prefix)), tmp)
    os.replace(tmp, path)
    return path


def import_parquet(path: str | os.PathLike[str], prompt_prefix: str = "") -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    tasks = []
    for i, row in enumerate(rows):
        where = f"{path}: row {i}"
        try:
            users = [m["content"] for m in row["prompt"] if m["role"] == "user"]
            target = row["reward_model"]["ground_truth"]["target"]
        except (KeyError, TypeError):
            raise ValueError(
                f"{where}: not veRL's schema (needs prompt[].role/content and "
                "reward_model.ground_truth.target)"
            ) from None
        question = users[-1]
        if prompt_prefix and question.startswith(prompt_prefix):
            question = question[len(prompt_prefix) :]
        extra = row.get("extra_info") or {}
        task: dict[str, Any] = {
            "id": f"{row.get('data_source', 'verl')}:{extra.get('index', i)}",
            "question": question,
            "answers": [target] if isinstance(target, str) else list(target),
            "gold_docs": [],
            "split": extra.get("split", ""),
        }
        for k in _EXTRA:
            if extra.get(k) is not None:
                task[k] = json.loads(extra[k])
        tasks.append(task)
    return tasks
