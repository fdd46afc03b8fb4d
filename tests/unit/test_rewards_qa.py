"""Answer checking and the citation chain, against hand-worked cases."""

from __future__ import annotations

import pytest

from tracerl.rewards import exact_match, f1, normalize, sub_exact_match, verify_citation

DOCS = {"d1": "Paris\nParis is the capital of France. It lies on the Seine."}


def test_normalisation_and_exact_match():
    assert normalize("  The Eiffel-Tower!  ") == "eiffeltower"
    assert exact_match("the Seine", ["Seine"]) == 1.0
    assert exact_match("Seine river", ["Seine"]) == 0.0
    assert sub_exact_match("Seine river", ["Seine"]) == 1.0
    assert sub_exact_match("Seinet", ["Seine"]) == 0.0  # whole words only


def test_f1_by_hand():
    # prediction tokens {new, york, city}, gold {new, york}: P = 2/3, R = 1, F1 = 0.8
    assert f1("New York City", ["New York"]) == pytest.approx(0.8)
    assert f1("Boston", ["New York"]) == 0.0


@pytest.mark.parametrize(
    ("citation", "answer", "verdict", "reason"),
    [
        ({"doc_id": "d1", "quote": "Paris is the capital of France"}, "France", True, None),
        ({"doc_id": "d9", "quote": "Paris is the capital"}, "France", False, "dead link"),
        ({"doc_id": "d1", "quote": "Paris is the capital of Spain"}, "Spain", False, "quote not"),
        ({"doc_id": "d1", "quote": "It lies on the Seine."}, "France", False, "does not mention"),
        ({"doc_id": "d1", "quote": "  paris IS the   capital "}, "Paris", True, None),
        ({"doc_id": "d1", "quote": ""}, "Paris", False, "quote not"),
    ],
)
def test_citation_chain(citation, answer, verdict, reason):
    v = verify_citation(citation, answer, DOCS.get)
    assert v["valid"] is verdict
    if reason:
        assert reason in v["reason"]
    # each link is checked only when the one before it held
    assert v["exists"] >= v["quoted"] >= v["supports"]


def test_a_judge_can_accept_a_paraphrase():
    cite = {"doc_id": "d1", "quote": "It lies on the Seine."}
    v = verify_citation(cite, "a river city", DOCS.get, judge=lambda q, a: "Seine" in q)
    assert v["valid"] and v["supports"]
