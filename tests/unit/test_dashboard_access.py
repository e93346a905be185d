"""``allot.auth.dashboard``: the dashboard's logins and what each role sees."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest

from allot.auth.dashboard import Access, Viewer
from allot.core.budgets import parse_tree
from allot.core.errors import ValidationError
from allot.ops.auth_gen import generate, hash_password

TREE = {
    "name": "root",
    "children": [{"name": "nlp", "shares": 1}, {"name": "vision", "shares": 1}],
}
ROLES = {
    "users": [
        {"name": "nlp", "role": "team", "allocations": ["nlp"]},
        {"name": "batch", "role": "team", "unallocated": True},
        {"name": "boss", "role": "manager", "node": "root"},
        {"name": "agent-a", "role": "agent", "hosts": ["h1"]},
        {"name": "svc", "role": "service"},
        {"name": "keeper", "role": "streams"},
    ]
}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("viewer", "allocation", "sees"),
    [
        (Viewer("nlp", "team", frozenset({"nlp"})), "nlp", True),
        (Viewer("nlp", "team", frozenset({"nlp"})), "vision", False),
        (Viewer("nlp", "team", frozenset({"nlp"})), None, False),
        (Viewer("batch", "team", frozenset({"~"})), None, True),
        (Viewer("batch", "team", frozenset({"~"})), "nlp", False),
        (Viewer("boss", "manager"), "vision", True),
        (Viewer("ops", "operator"), None, True),
    ],
)
def test_a_team_sees_only_its_allocations(
    viewer: Viewer, allocation: str | None, sees: bool
) -> None:
    assert viewer.sees(allocation) is sees


def test_auth_gen_writes_logins_with_each_users_scope(tmp_path: Path) -> None:
    auth = generate(parse_tree(TREE), ROLES, tmp_path, cost=4)
    assert auth.dashboard_users is not None
    assert stat.S_IMODE(auth.dashboard_users.stat().st_mode) == 0o600
    rows = json.loads(auth.dashboard_users.read_text())["users"]
    assert {k: (v["role"], v["allocations"]) for k, v in rows.items()} == {
        "nlp": ("team", ["nlp"]),
        "batch": ("team", ["~"]),
        "boss": ("manager", []),
        "agent-a": ("agent", []),
        "svc": ("service", []),
        "keeper": ("streams", []),
    }
    for name, creds in auth.users.items():
        assert rows[name]["password"].startswith("$2a$04$")
        assert creds.password not in auth.dashboard_users.read_text()
        assert creds.dashboard_password not in auth.dashboard_users.read_text()
        env = creds.path.read_text()
        assert f"ALLOT_DASHBOARD_PASSWORD={creds.dashboard_password}\n" in env
    access = Access.load(auth.dashboard_users)

    nlp = access.check(basic("nlp", auth.users["nlp"].dashboard_password))
    assert nlp is not None and nlp.scopes == ("nlp",) and nlp.allowed
    batch = access.check(basic("batch", auth.users["batch"].dashboard_password))
    assert batch is not None and batch.scopes == ("~",)
    boss = access.check(basic("boss", auth.users["boss"].dashboard_password))
    assert boss is not None and boss.scopes is None
    agent = access.check(basic("agent-a", auth.users["agent-a"].dashboard_password))
    assert agent is not None and not agent.allowed
    keeper = access.check(basic("keeper", auth.users["keeper"].dashboard_password))
    assert keeper is not None and not keeper.allowed  # a deploy step's login, no pages
    # The NATS password is not the pages' (the dashboard must never see it typed).
    assert access.check(basic("nlp", auth.users["nlp"].password)) is None
    assert auth.users["nlp"].password != auth.users["nlp"].dashboard_password


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer abc",
        "Basic !!!not-base64!!!",
        basic("nlp", "wrong"),
        basic("nobody", "pw"),
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),
    ],
)
def test_bad_credentials_authenticate_nobody(header: str | None) -> None:
    access = Access({"nlp": (hash_password("right", 4), Viewer("nlp", "team", frozenset()))})
    assert access.check(header) is None


def test_a_verified_password_is_remembered_and_a_changed_one_checked_again() -> None:
    access = Access({"u": (hash_password("right", 4), Viewer("u", "service"))})
    assert access.check(basic("u", "right")) is not None
    assert access.check(basic("u", "right")) is not None  # from the cache
    assert access.check(basic("u", "wrong")) is None  # a different password is not cached


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ("not json", "--users"),
        ('{"users": {"a": {"role": "service", "password": "$2a$x"}}}', "passwords"),
        ('{"passwords": "dashboard", "users": {}}', "users"),
        ('{"passwords": "dashboard", "users": {"a": 1}}', "users.a"),
        (
            '{"passwords": "dashboard", "users": {"a": {"role": "king", "password": "$2a$x"}}}',
            "users.a.role",
        ),
        (
            '{"passwords": "dashboard", "users": {"a": {"role": "service", "password": "plain"}}}',
            "users.a.password",
        ),
        (
            '{"passwords": "dashboard", "users": '
            '{"a": {"role": "team", "password": "$2a$x", "allocations": "nlp"}}}',
            "users.a.allocations",
        ),
    ],
)
def test_a_bad_users_file_is_refused_naming_the_field(
    tmp_path: Path, document: str, field: str
) -> None:
    path = tmp_path / "users.json"
    path.write_text(document)
    with pytest.raises(ValidationError) as err:
        Access.load(path)
    assert err.value.field == field


def test_a_missing_users_file_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as err:
        Access.load(tmp_path / "absent.json")
    assert err.value.field == "--users"
