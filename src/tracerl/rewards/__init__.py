"""Rewards: answer checking, citation verification (and, next, layered composition)."""

from tracerl.rewards.qa import exact_match, f1, normalize, sub_exact_match, verify_citation

__all__ = ["exact_match", "f1", "normalize", "sub_exact_match", "verify_citation"]
