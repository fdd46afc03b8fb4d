"""Questions with gold answers and gold supporting documents, split by topic.

``train`` and ``heldout`` share no topic and no gold document: held-out evaluation measures
search on subjects never trained on. ``adversarial`` (synthetic, held-out topics) holds traps
labelled by kind: look-alike titles, dead links, conflicting sources, tool timeouts.

* wiki — generated deterministically from the summaries:
  ``describe`` (a unique short description → the title), ``first_year`` (the first year
  the summary of a title mentions), and ``bridge`` (two hops: the subject that the summary
  of A mentions and that is described as D → its title);
* synthetic — 1-, 2- and 3-hop questions over the generated world (see `synthetic`).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import cache
from typing import Any

from tracerl.envs.search.corpus import Corpus, wiki_corpus
from tracerl.envs.search.synthetic import synthetic_questions, synthetic_world

SPLITS = ("train", "heldout", "adversarial")
WIKI_HELDOUT_TOPICS = frozenset({"Mathematics", "Philosophy and religion", "Everyday life"})
# A year, not a count ("about 1000 species"): preceded by a word that introduces a date.
_YEAR = re.compile(
    r"(?:\bin|\bsince|\bfrom|\bby|\buntil|\bc\.|\bborn|\bdied|\(|\bof)\s+"
    r"(?:\w+\s+){0,2}?(1[0-9]{3}|20[0-2][0-9])\b"
)


def heldout_topics(corpus: str) -> frozenset[str]:
    if corpus == "wiki":
        return WIKI_HELDOUT_TOPICS
    topics = synthetic_world().topics
    return frozenset(topics[::4])


@cache
def questions(corpus: str) -> tuple[dict[str, Any], ...]:
    if corpus == "wiki":
        qs = _wiki_questions(wiki_corpus())
    elif corpus == "synthetic":
        qs = synthetic_questions(synthetic_world())
    else:
        raise KeyError(f"no generated questions for corpus {corpus!r}; valid: wiki, synthetic")
    return tuple(qs)


def splits_of(corpus: str) -> tuple[str, ...]:
    """The splits a corpus has questions for: the adversarial traps exist only in the
    synthetic world; a corpus without generated questions (``jsonl:``) has none."""
    if corpus == "synthetic":
        return SPLITS
    if corpus == "wiki":
        return tuple(s for s in SPLITS if s != "adversarial")
    return ()


@cache
def split(corpus: str, name: str) -> tuple[dict[str, Any], ...]:
    """The questions of one split: every gold document's topic is on that side."""
    if name not in SPLITS:
        raise KeyError(f"unknown split {name!r}; valid: {', '.join(SPLITS)}")
    if name == "adversarial":
        if corpus != "synthetic":
            raise KeyError("the adversarial split is built on the synthetic corpus")
        return tuple({**q, "corpus": corpus, "split": name} for q in synthetic_world().adversarial)
    held = heldout_topics(corpus)
    docs = wiki_corpus() if corpus == "wiki" else synthetic_world().corpus
    out = []
    for q in questions(corpus):
        sides = {docs.by_id[d].topic in held for d in q["gold_docs"]}
        if len(sides) == 1 and (True in sides) == (name == "heldout"):
            out.append({**q, "corpus": corpus, "split": name})
    return tuple(out)


def sample(
    corpus: str, name: str, n: int, seed: int = 0, *, max_hops: int | None = None
) -> list[dict[str, Any]]:
    """`n` questions of a split (without replacement), optionally of at most `max_hops`."""
    pool = [q for q in split(corpus, name) if max_hops is None or q.get("hops", 1) <= max_hops]
    rng = random.Random(f"{corpus}:{name}:{seed}")
    return [dict(q) for q in rng.sample(pool, min(n, len(pool)))]


def reference_queries(corpus: Corpus, task: dict[str, Any]) -> list[str]:
    """One search query per gold document, taken from what the question says (what the
    reference agent searches, and the warm start imitates): a subject asked by its short
    description is searched by that description, never by its title (the answer); a
    subject the question names, by its title. Questions of other kinds (the synthetic
    world's name their entities) search each gold document's title."""
    titles = [corpus.by_id[d].title for d in task["gold_docs"]]
    described = re.search(r'short description "(.+?)"', task.get("question", ""))
    if task.get("kind") in ("describe", "bridge") and described:
        return [*titles[:-1], described.group(1)]
    return titles


def _wiki_questions(corpus: Corpus) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    desc_count: dict[str, int] = {}
    for d in corpus.docs:
        desc_count[d.description.lower()] = desc_count.get(d.description.lower(), 0) + 1
    unique_desc = {
        d.id for d in corpus.docs if d.description and desc_count[d.description.lower()] == 1
    }
    for d in corpus.docs:
        base = {"topic": d.topic, "gold_docs": [d.id], "hops": 1}
        if d.id in unique_desc and len(d.description) > 12:
            out.append(
                {
                    **base,
                    "id": f"{d.id}:describe",
                    "kind": "describe",
                    "answers": [d.title],
                    "question": f'Which subject has the short description "{d.description}"?',
                }
            )
        first = d.text.split(". ")[0]
        year = _YEAR.search(first)
        if year:
            out.append(
                {
                    **base,
                    "id": f"{d.id}:first_year",
                    "kind": "first_year",
                    "answers": [year.group(1)],
                    "question": f"Which year is the first date given in the first sentence "
                    f"of the summary of {d.title}?",
                }
            )
    out += _bridges(corpus, unique_desc)
    return [q for q in out if _fair(q, corpus)]


@cache
def _title_clashes(corpus: Corpus) -> frozenset[str]:
    """Normalised titles shared by several documents ("Centaurus" / "Centaurus A" under
    SQuAD normalisation): an exact match on them could be the wrong subject."""
    from tracerl.rewards.qa import normalize

    titles = [(d.title, normalize(d.title)) for d in corpus.docs]
    counts = Counter(norm for _, norm in titles)
    clashes = {norm for norm, n in counts.items() if n > 1}
    # also titles that normalise like another title once their "(…)" qualifier is dropped
    for title, norm in titles:
        base = normalize(title.split(" (")[0])
        if base != norm and base in counts:
            clashes |= {base, norm}
    return frozenset(clashes)


def _fair(q: dict[str, Any], corpus: Corpus) -> bool:
    """Drop questions a model could pass without the gold document: the answer is spelled
    in the question, or it is (after normalisation) also another document's title."""
    from tracerl.rewards.qa import normalize

    gold = normalize(q["answers"][0])
    if not gold or f" {gold} " in f" {normalize(q['question'])} ":
        return False
    return q["kind"] == "first_year" or gold not in _title_clashes(corpus)


def _bridges(corpus: Corpus, unique_desc: set[str]) -> list[dict[str, Any]]:
    """Two hops: A's summary mentions B (by its multi-word title); B is asked by description."""
    titles = {d.title: d for d in corpus.docs if " " in d.title and d.id in unique_desc}
    pattern = re.compile("|".join(re.escape(t) for t in sorted(titles, key=len, reverse=True)))
    out = []
    for a in corpus.docs:
        seen = {m.group(0) for m in pattern.finditer(a.text)} - {a.title}
        for t in sorted(seen)[:1]:
            b = titles[t]
            out.append(
                {
                    "id": f"{a.id}:bridge:{b.id}",
                    "kind": "bridge",
                    "hops": 2,
                    "topic": a.topic,
                    "gold_docs": [a.id, b.id],
                    "answers": [b.title],
                    "question": f"The summary of {a.title} mentions a subject with the short "
                    f'description "{b.description}". What is that subject?',
                }
            )
    return out
