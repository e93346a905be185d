"""The contract's "who may use it" (``x-allot-granted`` in proto/asyncapi.json) agrees with
what ``allot auth gen`` grants: for every channel and role, a concrete subject of that
channel is allowed to the role exactly when the contract lists the role."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from allot.core.budgets import BudgetTree, parse_tree
from allot.ops.auth_gen import Permissions, UserSpec, parse_roles, permissions

ROOT = Path(__file__).resolve().parents[2]
CONTRACT: dict[str, Any] = json.loads((ROOT / "proto" / "asyncapi.json").read_text())
TREE = {
    "name": "root",
    "children": [
        {"name": "research", "shares": 2, "children": [{"name": "nlp", "shares": 1}]},
        {"name": "search", "shares": 1},
    ],
}
USERS = {
    "team": {"name": "alice", "role": "team", "allocations": ["nlp"]},
    "manager": {"name": "lead", "role": "manager", "node": "research"},
    "operator": {"name": "ops", "role": "operator"},
    "agent": {"name": "agent1", "role": "agent", "hosts": ["h01"]},
    "streams": {"name": "keeper", "role": "streams"},
}
BACKSTAGE = ({"name": "svc", "role": "service"}, {"name": "keeper2", "role": "streams"})
"""The logins every roles file needs."""
# Each parameter filled with what the role's own grant is about: its allocation (nlp, below
# the manager's node), its host, its own login.
FILLED = {
    "allocation": "nlp",
    "workload": "w1",
    "event": "placed",
    "host": "h01",
    "path": "root.research.nlp",
    "deliver": "tok",
}


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or token not in ("*", s[i]):
            return False
    return len(p) == len(s)


def allowed(grants: Permissions, subject: str, action: str) -> bool:
    if action == "send":
        return any(matches(p, subject) for p in grants.publish) and not any(
            matches(d, subject) for d in grants.deny_publish
        )
    return any(matches(p, subject) for p in grants.subscribe)


def channels() -> list[tuple[str, str, str]]:
    """(channel id, address, action) of every channel with an address."""
    action = {
        op["channel"]["$ref"].rsplit("/", 1)[1]: op["action"]
        for op in CONTRACT["operations"].values()
    }
    return [
        (cid, c["address"], action[cid])
        for cid, c in sorted(CONTRACT["channels"].items())
        if c["address"] is not None
    ]


@pytest.fixture(scope="module")
def tree() -> BudgetTree:
    return parse_tree(TREE)


def test_matches_follows_nats_wildcards() -> None:
    assert matches("a.*.c", "a.b.c") and not matches("a.*.c", "a.b.d")
    assert matches("a.>", "a.b.c") and not matches("a.>", "a")
    assert not matches("a.b", "a.b.c") and not matches("a.b.c", "a.b")


@pytest.mark.parametrize(("cid", "address", "action"), channels(), ids=str)
@pytest.mark.parametrize("role", sorted(USERS))
def test_the_contract_names_exactly_the_roles_granted(
    tree: BudgetTree, role: str, cid: str, address: str, action: str
) -> None:
    spec: UserSpec = next(
        u
        for u in parse_roles({"users": [USERS[role], *BACKSTAGE]}, tree)
        if u.name == USERS[role]["name"]
    )
    subject = address.format(**FILLED, login=spec.name)
    documented = role in CONTRACT["channels"][cid]["x-allot-granted"]
    assert allowed(permissions(spec, tree), subject, action) == documented, (
        f"{cid}: {subject} ({action}) for a {role}: the contract says "
        f"{'granted' if documented else 'not granted'}"
    )
