"""`lookup`: one- and two-hop questions over a generated knowledge base served by the `lookup` tool.

The knowledge base (KB) is a JSONL file of rows {"entity": str, "facts": {relation: value}} (the format the
builtin `lookup` tool reads): people {born_in, works_at}, companies {manager, based_in} and cities {country}.
Every name is made up (syllable words), so no answer can be known without calling the tool. A one-hop question
("Who manages Kalo Works?") needs one call; a two-hop question ("Where was the manager of Kalo Works born?")
needs a call on the question's entity, then a call on the value the first response returned.

What a small model must learn: copy the entity name from the question into `lookup`, find the asked relation in
the response, copy its value either into a second call (two hops) or into `<answer>...</answer>`.

Names are quoted in questions ('Who manages "Kalo Works"?') and the tool answers in JSON, so a name is the same
tokens wherever it appears: after a quote, as in the call's JSON. Unquoted, "Kalo" after a space is another
token (" Kalo") than inside the call ("Kalo"), and a model of a few million parameters spends most of its
budget learning that the two spell the same name.

Splits differ in distribution, not only seed:
- names: a whole name belongs to exactly one split (`common.name_in_split`), so held-out questions are about
  entities never seen in training, built from the same syllables (familiar tokens, unseen combinations);
- hops: train is 70% one-hop / 30% two-hop, held-out 30% / 70%. The train split's *hard mix* (`hard=True`, what
  the quickstart gives GRPO) has the held-out hop mix over train names: two-hop questions are where RL has most
  to fix (which relation of the first response to follow).
Each split has its own KB file; tasks point to it through tools_kwargs {"lookup": {"kb_path": ...}}.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentrl.data.suites.common import SuiteError, check_hard, name_in_split, split_rng, task_row, unique_rows

NAME = "lookup"
TOOLS = ["lookup"]
SYSTEM = "Use the lookup tool to find facts, then give the answer inside answer tags."  # in words: see calc.SYSTEM

SYLLABLES = ["ka", "lo", "mi", "ra", "ze", "tu", "vo", "ni", "sa", "el", "an", "or", "ba", "de", "fi", "go", "hu",
             "ko", "lu", "ma", "ne", "po", "ri", "te", "wa", "yo"]
COMPANY_SUFFIXES = ["Labs", "Works", "Corp", "Group", "Foods", "Motors", "Systems", "Trading"]

# (entity kind, relation path, question template)
QUESTIONS: list[tuple[str, tuple[str, ...], str]] = [
    ("person", ("born_in",), 'Where was "{e}" born?'),
    ("person", ("works_at",), 'Which company does "{e}" work for?'),
    ("company", ("manager",), 'Who manages "{e}"?'),
    ("company", ("based_in",), 'In which city is "{e}" based?'),
    ("city", ("country",), 'Which country is "{e}" in?'),
    ("company", ("manager", "born_in"), 'Where was the manager of "{e}" born?'),
    ("company", ("based_in", "country"), 'Which country is "{e}" based in?'),
    ("person", ("works_at", "manager"), 'Who manages the company "{e}" works for?'),
    ("person", ("born_in", "country"), 'Which country was "{e}" born in?'),
    ("person", ("works_at", "based_in"), 'In which city is the company "{e}" works for based?'),
]

TWO_HOP_SHARE = {"train": 0.3, "heldout": 0.7}
HARD_TWO_HOP_SHARE = 0.7  # the train split's hard mix


@dataclass
class KnowledgeBase:
    facts: dict[str, dict[str, str]]  # entity -> {relation: value}
    kinds: dict[str, list[str]]  # "person" | "company" | "city" -> entity names

    def rows(self) -> list[dict]:
        """KB rows sorted by entity name (the JSONL the `lookup` tool reads)."""
        return [{"entity": e, "facts": self.facts[e]} for e in sorted(self.facts)]

    def follow(self, entity: str, relations: tuple[str, ...]) -> list[str]:
        """The values met along `relations` starting at `entity` (the last one is the answer)."""
        chain, current = [], entity
        for rel in relations:
            current = self.facts[current][rel]
            chain.append(current)
        return chain


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


def _names(rng: random.Random, count: int, split: str, make, taken: set[str]) -> list[str]:
    out: list[str] = []
    for _ in range(200 * count + 1000):
        if len(out) == count:
            return out
        name = make(rng)
        if name not in taken and name_in_split(name, split):
            taken.add(name)
            out.append(name)
    raise SuiteError(f"lookup/{split}: could not draw {count} distinct names; ask for fewer tasks")


def make_kb(split: str, n: int, seed: int = 0) -> KnowledgeBase:
    """A KB sized for `n` questions: max(40, n) people, max(20, n // 2) companies, max(20, n // 4) cities."""
    rng = split_rng(NAME + "-kb", split, seed)
    taken: set[str] = set()
    n_people, n_companies, n_cities = max(40, n), max(20, n // 2), max(20, n // 4)
    countries = _names(rng, 12, split, lambda r: _word(r, 2) + "ia", taken)
    cities = _names(rng, n_cities, split, lambda r: _word(r, 3), taken)
    people = _names(rng, n_people, split, lambda r: f"{_word(r, 2)} {_word(r, r.choice((2, 3)))}", taken)
    companies = _names(rng, n_companies, split,
                       lambda r: f"{_word(r, r.choice((2, 3)))} {r.choice(COMPANY_SUFFIXES)}", taken)
    facts: dict[str, dict[str, str]] = {}
    for city in cities:
        facts[city] = {"country": rng.choice(countries)}
    managers = rng.sample(people, n_companies)
    for company, manager in zip(companies, managers):
        facts[company] = {"manager": manager, "based_in": rng.choice(cities)}
    manages = dict(zip(managers, companies))
    for person in people:
        # A manager works at the company it manages, so the two relations never contradict each other.
        facts[person] = {"born_in": rng.choice(cities), "works_at": manages.get(person) or rng.choice(companies)}
    return KnowledgeBase(facts=facts, kinds={"person": people, "company": companies, "city": cities})


def make_tasks(split: str, n: int, seed: int = 0, *, kb_path: str,
               hard: bool = False) -> tuple[list[dict], KnowledgeBase]:
    """`n` distinct lookup tasks of `split` and their KB; the tasks point to `kb_path` (write the KB there).
    `hard`: the train split's hard mix (see the module docstring)."""
    if hard:
        check_hard(NAME, split)
    two_hop_share = HARD_TWO_HOP_SHARE if hard else TWO_HOP_SHARE[split]
    kb = make_kb(split, n, seed)
    rng = split_rng(NAME, split, seed)
    one_hop = [q for q in QUESTIONS if len(q[1]) == 1]
    two_hop = [q for q in QUESTIONS if len(q[1]) == 2]

    asked: set[tuple[str, str]] = set()

    def one() -> dict:
        # Redraw the entity, not the question, so that every question is as likely as the docstring says. An
        # entity is redrawn when it would answer itself ("Who manages the company X works for?" where X is that
        # manager) or was asked already; redrawing the question instead made that one half as frequent as its
        # sibling, and GRPO learnt to answer both with the city (docs/quickstart.md).
        for _ in range(1000):
            kind, relations, template = rng.choice(two_hop if rng.random() < two_hop_share else one_hop)
            for _ in range(10 * len(kb.kinds[kind])):
                entity = rng.choice(kb.kinds[kind])
                chain = kb.follow(entity, relations)
                if chain[-1] != entity and (template, entity) not in asked:
                    asked.add((template, entity))
                    return task_row(NAME, split, system=SYSTEM, user=template.format(e=entity), tools=TOOLS,
                                    reward={"type": "exact_match", "ground_truth": chain[-1]},
                                    tools_kwargs={"lookup": {"kb_path": kb_path}},
                                    extra={"entity": entity, "relations": list(relations), "chain": chain})
            # (practically never) every entity of this question was asked already: another question
        raise SuiteError(f"lookup/{split}: every question was asked already; ask for fewer tasks")

    return unique_rows(n, one, what=f"lookup/{split}"), kb
