"""Answer checking for question answering: normalisation, exact match, sub-EM, token F1,
and the citation verification chain. Pure functions of strings (and a document lookup).

Normalisation follows the SQuAD convention used by Search-R1's exact match: lower case,
punctuation and the articles a/an/the removed, whitespace collapsed.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer."""
    p = normalize(prediction)
    return float(any(p == normalize(g) for g in golds))


def sub_exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if a normalised gold answer occurs inside the normalised prediction (lenient:
    easy to game with long answers — use it as a signal, never alone)."""
    p = f" {normalize(prediction)} "
    return float(any(f" {normalize(g)} " in p for g in golds if normalize(g)))


def f1(prediction: str, golds: Sequence[str]) -> float:
    """The best token-overlap F1 against the gold answers."""
    best = 0.0
    p = normalize(prediction).split()
    for g in golds:
        t = normalize(g).split()
        common = sum((Counter(p) & Counter(t)).values())
        if common:
            precision, recall = common / len(p), common / len(t)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _norm_quote(text: str) -> str:
    return " ".join(text.lower().split())


def verify_citation(
    citation: dict[str, Any],
    answer: str,
    lookup: Callable[[str], str | None],
    *,
    judge: Callable[[str, str], bool] | None = None,
) -> dict[str, Any]:
    """The chain for one citation; each link is checked only if the previous one held.

    1. ``exists`` — the cited document exists (not a dead link);
    2. ``quoted`` — the quote occurs in that document (whitespace and case normalised);
    3. ``supports`` — the quote supports the answer: the normalised answer occurs in the
       quote, or, when given, `judge(quote, answer)` says so.

    Returns the verdicts and ``valid`` (all three), stored as the reward's evidence.
    """
    doc_id, quote = str(citation.get("doc_id", "")), str(citation.get("quote", ""))
    verdict: dict[str, Any] = {
        "doc_id": doc_id,
        "exists": False,
        "quoted": False,
        "supports": False,
    }
    text = lookup(doc_id)
    if text is None:
        verdict["reason"] = "dead link"
        return {**verdict, "valid": False}
    verdict["exists"] = True
    if not quote.strip() or _norm_quote(quote) not in _norm_quote(text):
        verdict["reason"] = "quote not in document"
        return {**verdict, "valid": False}
    verdict["quoted"] = True
    a = normalize(answer)
    supports = bool(a) and f" {a} " in f" {normalize(quote)} "
    if not supports and judge is not None:
        supports = bool(judge(quote, answer))
    verdict["supports"] = supports
    if not supports:
        verdict["reason"] = "quote does not mention the answer"
    return {**verdict, "valid": supports}
