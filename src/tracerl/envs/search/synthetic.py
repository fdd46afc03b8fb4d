"""A generated fictional world, so questions cannot be answered from a model's memory.

Countries, cities, people and organisations with invented names, related by facts (a city
lies in a country, a person was born in a city in a year, an organisation was founded by a
person in a year and is headquartered in a city). Each entity gets an encyclopedia-style
article stating its facts; a fact about a relation is stated only in the article of its
subject, so a multi-hop question needs one search per hop.

Every country is a topic, and every fact chain stays inside one country, so splitting by
topic leaves train and held-out questions with no topic and no gold document in common.
Everything is deterministic in the seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from tracerl.envs.search.documents import Corpus, Doc

_ONSETS = ["b", "br", "d", "dr", "f", "g", "k", "kr", "l", "m", "n", "p", "r", "s", "t", "v", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "l", "n", "r", "s", "th", "m", "k"]
_SECTORS = ["Instruments", "Shipping", "Textiles", "Observatory", "Press", "Mills", "Institute"]


@dataclass
class World:
    corpus: Corpus
    facts: dict[str, dict[str, Any]]  # entity id -> facts (kind, name, relations)
    topics: list[str] = field(default_factory=list)
    adversarial: list[dict[str, Any]] = field(default_factory=list)


def _name(rng: random.Random, syllables: int) -> str:
    parts = [
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
    ]
    return "".join(parts).capitalize()


def _unique(rng: random.Random, used: set[str], syllables: int, suffix: str = "") -> str:
    while True:
        name = _name(rng, syllables) + suffix
        if name not in used:
            used.add(name)
            return name


@cache
def synthetic_world(
    seed: int = 0, countries: int = 12, cities: int = 4, people: int = 8, orgs: int = 4
) -> World:
    rng = random.Random(f"tracerl-synthetic-{seed}")
    used: set[str] = set()
    facts: dict[str, dict[str, Any]] = {}
    topics = []
    for c in range(countries):
        country = _unique(rng, used, 2, "ia")
        topics.append(country)
        cid = f"syn:country:{c}"
        city_ids = []
        for k in range(cities):
            city_id = f"syn:city:{c}.{k}"
            facts[city_id] = {
                "kind": "city",
                "name": _unique(rng, used, 3),
                "country": cid,
                "founded": rng.randint(900, 1700),
                "topic": country,
            }
            city_ids.append(city_id)
        facts[cid] = {
            "kind": "country",
            "name": country,
            "capital": city_ids[0],
            "topic": country,
        }
        person_ids = []
        for p in range(people):
            pid = f"syn:person:{c}.{p}"
            facts[pid] = {
                "kind": "person",
                "name": f"{_unique(rng, used, 2)} {_unique(rng, used, 2)}",
                "born_in": rng.choice(city_ids),
                "born": rng.randint(1850, 1990),
                "topic": country,
            }
            person_ids.append(pid)
        for o in range(orgs):
            oid = f"syn:org:{c}.{o}"
            founder = person_ids[o % len(person_ids)]
            facts[oid] = {
                "kind": "org",
                "name": f"{_unique(rng, used, 2)} {rng.choice(_SECTORS)}",
                "founder": founder,
                "founded": facts[founder]["born"] + rng.randint(20, 45),
                "hq": rng.choice(city_ids),
                "topic": country,
            }
    docs = [
        Doc(id=i, title=f["name"], text=_article(i, facts), topic=f["topic"])
        for i, f in facts.items()
    ]
    extra, adversarial = _adversarial(facts, topics[::4], rng)
    world = World(Corpus(f"synthetic:{seed}", docs + extra), facts, topics)
    world.adversarial = adversarial
    return world


ADVERSARIAL_KINDS = ("look_alike", "dead_link", "conflict", "timeout")


def _adversarial(
    facts: dict[str, dict[str, Any]], held_topics: list[str], rng: random.Random
) -> tuple[list[Doc], list[dict[str, Any]]]:
    """Traps in the held-out countries, each question labelled with its kind:

    * ``look_alike`` — a document whose title differs from the subject's by one letter and
      states a different birthplace;
    * ``dead_link`` — an "archive note" pointing to a document id that does not exist;
    * ``conflict`` — an unverified source contradicting the subject's own article (the
      answer is the authoritative one);
    * ``timeout`` — an ordinary question, asked while the search tool times out (the
      evaluation wraps these in a `FaultInjector`).
    """
    docs, questions = [], []
    for topic in held_topics:
        people = [i for i, f in facts.items() if f["kind"] == "person" and f["topic"] == topic]
        orgs = [i for i, f in facts.items() if f["kind"] == "org" and f["topic"] == topic]
        cities = [i for i, f in facts.items() if f["kind"] == "city" and f["topic"] == topic]
        for n, pid in enumerate(people[:2]):
            p = facts[pid]
            wrong = facts[rng.choice([c for c in cities if c != p["born_in"]])]["name"]
            twin = p["name"][:-1] + ("a" if p["name"][-1] != "a" else "e")
            docs.append(
                Doc(
                    f"adv:look:{pid}",
                    twin,
                    f"{twin} (born {p['born'] + 7}) is a figure "
                    f"from {wrong}. {twin} was born in {wrong}.",
                    topic,
                )
            )
            questions.append(
                _adv(
                    f"{pid}:look_alike:{n}",
                    "look_alike",
                    f"In which city was {p['name']} born?",
                    facts[p["born_in"]]["name"],
                    [pid],
                    topic,
                )
            )
        for oid in orgs[:2]:
            o = facts[oid]
            docs.append(
                Doc(
                    f"adv:archive:{oid}",
                    f"Archive note on {o['name']}",
                    f"The founding records of {o['name']} were moved to document "
                    f"adv:missing:{oid}.",
                    topic,
                )
            )
            questions.append(
                _adv(
                    f"{oid}:dead_link",
                    "dead_link",
                    f"Who founded {o['name']}?",
                    facts[o["founder"]]["name"],
                    [oid],
                    topic,
                )
            )
        for pid in people[2:4]:
            p = facts[pid]
            docs.append(
                Doc(
                    f"adv:rumour:{pid}",
                    f"Rumours about {p['name']}",
                    f"An unverified travel blog claims that {p['name']} was born in "
                    f"{p['born'] - 11}.",
                    topic,
                )
            )
            questions.append(
                _adv(
                    f"{pid}:conflict",
                    "conflict",
                    f"In which year was {p['name']} born?",
                    p["born"],
                    [pid],
                    topic,
                )
            )
        for pid in people[4:6]:
            p = facts[pid]
            questions.append(
                _adv(
                    f"{pid}:timeout",
                    "timeout",
                    f"In which city was {p['name']} born?",
                    facts[p["born_in"]]["name"],
                    [pid],
                    topic,
                )
            )
    return docs, questions


def _adv(qid: str, kind: str, question: str, answer: Any, gold: list[str], topic: str) -> dict:
    return {
        "id": f"adv:{qid}",
        "kind": kind,
        "question": question,
        "answers": [str(answer)],
        "gold_docs": gold,
        "hops": 1,
        "topic": topic,
    }


def _article(eid: str, facts: dict[str, dict[str, Any]]) -> str:
    f = facts[eid]

    def name(x: str) -> str:
        return facts[x]["name"]

    if f["kind"] == "country":
        return (
            f"{f['name']} is a country. Its capital and largest city is {name(f['capital'])}. "
            f"{f['name']} is known for its river valleys and old trading towns."
        )
    if f["kind"] == "city":
        return (
            f"{f['name']} is a city in {name(f['country'])}, founded in {f['founded']}. "
            f"It grew around a market square and a stone bridge."
        )
    if f["kind"] == "person":
        return (
            f"{f['name']} (born {f['born']}) is a figure from {name(f['born_in'])}. "
            f"{f['name']} was born in {name(f['born_in'])} in {f['born']} and became known "
            "for work in trade and public life."
        )
    return (
        f"{f['name']} is an organisation founded in {f['founded']} by {name(f['founder'])}. "
        f"Its headquarters are in {name(f['hq'])}."
    )


def synthetic_questions(world: World) -> list[dict[str, Any]]:
    """1-, 2- and 3-hop questions with gold answers and gold supporting documents."""
    facts, out = world.facts, []

    def q(qid: str, hops: int, question: str, answer: Any, gold: list[str]) -> None:
        out.append(
            {
                "id": qid,
                "question": question,
                "answers": [str(answer)],
                "gold_docs": gold,
                "hops": hops,
                "topic": facts[gold[0]]["topic"],
            }
        )

    for eid, f in facts.items():
        if f["kind"] == "person":
            city = f["born_in"]
            q(
                f"{eid}:born_in",
                1,
                f"In which city was {f['name']} born?",
                facts[city]["name"],
                [eid],
            )
            q(f"{eid}:born", 1, f"In which year was {f['name']} born?", f["born"], [eid])
            q(
                f"{eid}:country",
                2,
                f"In which country was {f['name']} born?",
                facts[facts[city]["country"]]["name"],
                [eid, city],
            )
        elif f["kind"] == "org":
            founder = f["founder"]
            city = facts[founder]["born_in"]
            q(f"{eid}:founder", 1, f"Who founded {f['name']}?", facts[founder]["name"], [eid])
            q(
                f"{eid}:founder_born",
                2,
                f"In which year was the founder of {f['name']} born?",
                facts[founder]["born"],
                [eid, founder],
            )
            q(
                f"{eid}:founder_city_founded",
                3,
                f"In which year was the birthplace of the founder of {f['name']} founded?",
                facts[city]["founded"],
                [eid, founder, city],
            )
    return out
