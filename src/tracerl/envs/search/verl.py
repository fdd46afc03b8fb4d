"""Datasets in veRL's parquet schema, so they move between tracerl and veRL/Search-R1 as is.

One row per question:

    data_source   "tracerl_<corpus>" (Search-R1 uses "nq", "hotpotqa", ...)
    prompt        chat messages: [{"role": "user", "content": ...}]
    ability       "fact-reasoning"
    reward_model  {"style": "rule", "ground_truth": {"target": [answers...]}}
    extra_info    {"split", "index", and tracerl's fields: id, gold_docs, hops, topic, kind}

Import reads any file with that schema (Search-R1's own processed data included): the
question is the last user message, the answers are ``ground_truth.target``; tracerl's fields
come back when present. It is liberal in what a value may be (a plain string or number in
``extra_info`` where tracerl writes JSON text, a ``ground_truth`` that is the answer itself)
and refuses a row it cannot make a task of (no user message, no answers, a field of the wrong
kind) with `DatasetError`, naming the file, the row and the field. The search environment
trains on such a file through its ``tasks`` argument (`tracerl.envs.search.task_files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tracerl.errors import UserError

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


class DatasetError(UserError, ValueError):
    """A row (or the file) that is not in veRL's schema: the message names the file, the row
    and the field."""


_FORMAT_HINT = (
    "a veRL row needs prompt (chat messages, a user message last among them) and "
    "reward_model.ground_truth.target (the answers); extra_info is optional"
)


def _decoded(value: Any) -> Any:
    """A value of ``extra_info`` as it was meant: JSON text decoded (what `export_parquet`
    writes), anything else (a plain string, a number, a list) as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _extra_field(key: str, value: Any, where: str) -> Any:
    """tracerl's field `key` of ``extra_info``, in the type a task has; `DatasetError` for
    a value that cannot be one."""
    decoded = _decoded(value)
    if key == "gold_docs":
        if isinstance(decoded, str):
            return [decoded]
        if isinstance(decoded, list | tuple) and all(isinstance(d, str) for d in decoded):
            return list(decoded)
        raise DatasetError(
            f"{where}: extra_info.gold_docs is {value!r}, not a list of document ids",
            _FORMAT_HINT,
        )
    if key == "hops":
        if isinstance(decoded, float) and decoded.is_integer():
            decoded = int(decoded)
        if isinstance(decoded, int) and not isinstance(decoded, bool) and decoded >= 1:
            return decoded
        raise DatasetError(
            f"{where}: extra_info.hops is {value!r}, not a number of hops (1 or more)",
            _FORMAT_HINT,
        )
    # id, topic, kind, corpus: text; a plain string is taken as it is ("123" stays text)
    if isinstance(value, str):
        return decoded if isinstance(decoded, str) else value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise DatasetError(f"{where}: extra_info.{key} is {value!r}, not text", _FORMAT_HINT)


def _question(prompt: Any, where: str) -> str:
    """The last user message of a row's `prompt`."""
    if not isinstance(prompt, list | tuple) or not prompt:
        raise DatasetError(
            f"{where}: prompt is {prompt!r}, not a list of chat messages", _FORMAT_HINT
        )
    users = []
    for j, m in enumerate(prompt):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DatasetError(
                f"{where}: prompt[{j}] is {m!r}, not a chat message (role, content)",
                _FORMAT_HINT,
            )
        if m["role"] == "user":
            if not isinstance(m["content"], str) or not m["content"].strip():
                raise DatasetError(
                    f"{where}: prompt[{j}].content is {m['content']!r}, not the question's text",
                    _FORMAT_HINT,
                )
            users.append(m["content"])
    if not users:
        roles = ", ".join(str(m["role"]) for m in prompt)
        raise DatasetError(
            f"{where}: prompt holds no user message (roles: {roles}), so no question",
            _FORMAT_HINT,
        )
    return users[-1]


def _answers(reward_model: Any, where: str) -> list[str]:
    """A row's gold answers: ``reward_model.ground_truth.target`` (a list or one value), or
    a ground truth given as the answer itself."""
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise DatasetError(
            f"{where}: reward_model is {reward_model!r}, with no ground_truth", _FORMAT_HINT
        )
    truth = reward_model["ground_truth"]
    if isinstance(truth, str) and isinstance(_decoded(truth), dict | list):
        truth = _decoded(truth)  # JSON text of the struct or list; else the answer itself
    target = truth.get("target") if isinstance(truth, dict) else truth
    field = "reward_model.ground_truth" + (".target" if isinstance(truth, dict) else "")
    values = [target] if isinstance(target, str | int | float) else target
    if (
        not isinstance(values, list | tuple)
        or not values
        or not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in values)
    ):
        raise DatasetError(
            f"{where}: {field} is {target!r}, not the answers (a string or a list of strings)",
            _FORMAT_HINT,
        )
    return [str(v) for v in values]


def _read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise DatasetError(f"{path}: no such file", "give a .parquet file in veRL's schema")
    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(
            f"{path}: not a parquet file pyarrow can read ({e})",
            "give a .parquet file in veRL's schema",
        ) from e


def import_parquet(path: str | os.PathLike[str], prompt_prefix: str = "") -> list[dict[str, Any]]:
    """The tasks of a parquet file in veRL's schema. Liberal in what a value may be (a plain
    string where tracerl writes JSON text, a ground truth that is the answer itself); a row
    that has no question or no answers is refused with `DatasetError` naming the file, the
    row and the field."""
    tasks = []
    for i, row in enumerate(_read_rows(path)):
        where = f"{path}: row {i}"
        if not isinstance(row, dict) or "prompt" not in row or "reward_model" not in row:
            missing = [k for k in ("prompt", "reward_model") if k not in (row or {})]
            raise DatasetError(f"{where}: no {' and no '.join(missing)} column", _FORMAT_HINT)
        question = _question(row["prompt"], where)
        answers = _answers(row["reward_model"], where)
        if prompt_prefix and question.startswith(prompt_prefix):
            question = question[len(prompt_prefix) :]
        extra = _decoded(row.get("extra_info")) or {}
        if not isinstance(extra, dict):
            raise DatasetError(
                f"{where}: extra_info is {row.get('extra_info')!r}, not a struct of fields",
                _FORMAT_HINT,
            )
        split = extra.get("split")
        task: dict[str, Any] = {
            "id": f"{row.get('data_source') or 'verl'}:{extra.get('index', i)}",
            "question": question,
            "answers": answers,
            "gold_docs": [],
            "split": "" if split is None else str(split),
        }
        for k in _EXTRA:
            if extra.get(k) is not None:
                task[k] = _extra_field(k, extra[k], where)
        tasks.append(task)
    return tasks
