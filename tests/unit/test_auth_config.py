"""`allot auth gen` and its generator: roles validation, grants per role, files written."""

from __future__ import annotations

import argparse
import json
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_contract_grants import allowed

from allot import bus
from allot.adapters.embedded import find_nats_server
from allot.auth.client import (
    CA_ENV,
    add_nats_url_argument,
    client_tls,
    inbox_prefix_for_url,
    login_for,
    masked_url,
    nats_url_from_env,
    redis_url_from_env,
)
from allot.bus.service_main import base_parser
from allot.cli import auth_cmd
from allot.core.budgets import BudgetTree, parse_tree, subtree_allocations
from allot.core.errors import ValidationError
from allot.ops.auth_gen import (
    ASKERS,
    SERVICE_NAMES,
    UserSpec,
    budget_path,
    generate,
    parse_roles,
    permissions,
    render_config,
)

TREE = {
    "name": "root",
    "children": [
        {
            "name": "research",
            "shares": 2,
            "children": [{"name": "nlp", "shares": 1}, {"name": "vision", "shares": 1}],
        },
        {"name": "search", "shares": 1},
    ],
}
SERVICE = {"name": "svc", "role": "service"}
STREAMS = {"name": "keeper", "role": "streams"}


@pytest.fixture
def tree() -> BudgetTree:
    return parse_tree(TREE)


def roles(*users: dict[str, object]) -> dict[str, object]:
    return {"users": [*users, SERVICE, STREAMS]}


# -- roles file ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        ([], "roles", "must be a mapping"),
        ({"users": [], "x": 1}, "roles", "unknown field(s) x"),
        ({"users": []}, "users", "non-empty list"),
        ({"users": [{"name": "a", "role": "team", "allocations": ["nlp"]}]}, "users", "service"),
        (roles({"name": "a b", "role": "operator"}), "users[0].name", "[A-Za-z0-9_-]"),
        (roles({"name": "a", "role": "admin"}), "users[0].role", "must be one of"),
        (roles({"name": "a", "role": "operator", "hosts": []}), "users[0]", "hosts"),
        (
            roles({"name": "a", "role": "team", "allocations": ["research"]}),
            "users[0].allocations[0]",
            "not an allocation",
        ),
        (
            roles({"name": "a", "role": "team", "allocations": ["nope"]}),
            "users[0].allocations[0]",
            "nlp",
        ),
        (
            roles({"name": "a", "role": "team", "allocations": []}),
            "users[0].allocations",
            "at least one",
        ),
        (
            roles({"name": "a", "role": "team", "allocations": "nlp"}),
            "users[0].allocations",
            "list",
        ),
        (
            roles({"name": "a", "role": "team", "allocations": ["nlp", "nlp"]}),
            "users[0].allocations",
            "repeats nlp",
        ),
        (
            roles({"name": "a", "role": "team", "allocations": ["nlp"], "unallocated": "yes"}),
            "users[0].unallocated",
            "true or false",
        ),
        (roles({"name": "a", "role": "manager", "node": "nope"}), "users[0].node", "not a node"),
        (roles({"name": "a", "role": "agent", "hosts": []}), "users[0].hosts", "at least one host"),
        (roles({"name": "a", "role": "agent", "hosts": ["h.1"]}), "users[0].hosts[0]", "'.'"),
        (roles({"name": "svc", "role": "operator"}), "users[1].name", "repeats users[0]"),
        # a team's listed users: each one login, named once, never another row's name
        (
            roles({"name": "nlp", "role": "team", "allocations": ["nlp"], "users": "alice"}),
            "users[0].users",
            "list",
        ),
        (
            roles({"name": "nlp", "role": "team", "allocations": ["nlp"], "users": []}),
            "users[0].users",
            "lists no user",
        ),
        (
            roles({"name": "nlp", "role": "team", "allocations": ["nlp"], "users": ["a b"]}),
            "users[0].users[0]",
            "[A-Za-z0-9_-]",
        ),
        (
            roles({"name": "nlp", "role": "team", "allocations": ["nlp"], "users": ["al", "al"]}),
            "users[0].users[1]",
            "'al' repeats users[0].users[0]",
        ),
        (
            roles(
                {"name": "nlp", "role": "team", "allocations": ["nlp"], "users": ["al"]},
                {"name": "vision", "role": "team", "allocations": ["vision"], "users": ["al"]},
            ),
            "users[1].users[0]",
            "'al' is also listed at users[0].users[0]",
        ),
        (
            roles(
                {"name": "nlp", "role": "team", "allocations": ["nlp"], "users": ["ops"]},
                {"name": "ops", "role": "operator"},
            ),
            "users[0].users[0]",
            "'ops' is the name of users[1]",
        ),
        (
            roles(
                {"name": "nlp", "role": "team", "allocations": ["nlp"], "users": ["vision"]},
                {"name": "vision", "role": "team", "allocations": ["vision"]},
            ),
            "users[0].users[0]",
            "'vision' is the name of users[1]",
        ),
        (roles({"name": "o", "role": "operator", "users": ["a"]}), "users[0]", "users"),
    ],
)
def test_bad_roles_name_the_field(tree: BudgetTree, data: object, field: str, reason: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_roles(data, tree)
    assert exc.value.field == field
    assert reason in exc.value.reason


# -- grants ----------------------------------------------------------------------------------


def test_team_members_are_logins_of_their_own_with_the_teams_grants(tree: BudgetTree) -> None:
    users = parse_roles(
        roles(
            {"name": "nlp", "role": "team", "allocations": ["nlp"], "users": ["alice", "nlp"]},
            {"name": "vision", "role": "team", "allocations": ["vision"]},
        ),
        tree,
    )
    assert [(u.name, u.role, u.allocations, u.team) for u in users] == [
        ("alice", "team", ("nlp",), "nlp"),
        ("nlp", "team", ("nlp",), "nlp"),  # a member may bear the team's name
        ("vision", "team", ("vision",), None),  # a row without users is one login
        ("svc", "service", (), None),
        ("keeper", "streams", (), None),
    ]
    alice = permissions(users[0], tree)
    assert "allot.v1.submit.nlp.alice" in alice.publish
    assert "allot.v1.cancel.nlp.*.user.alice" in alice.publish
    assert "_INBOX_alice.>" in alice.subscribe


def test_team_grants_name_only_its_allocations(tree: BudgetTree) -> None:
    user = UserSpec("nlp", "team", allocations=("nlp",))
    p = permissions(user, tree)
    assert set(p.publish) == {
        # commands in their identity forms only, with this login's own token
        "allot.v1.submit.nlp.nlp",
        "allot.v1.cancel.nlp.*.user.nlp",
        "allot.v1.watch.nlp",
        "allot.v1.query.queue.nlp",
        "allot.v1.query.prio.nlp",
        "allot.v1.query.status.nlp",
        "allot.v1.query.idle.nlp",  # its own runs flagged idle
        "allot.v1.query.share",
        "allot.v1.query.allocations",
        "allot.v1.query.owed",
        "allot.v1.query.usage",
        "allot.v1.query.hosts",
        "allot.v1.query.placement_stats",
    }
    # never another allocation's queue or a status of any workload by id alone
    assert not any(x.startswith("allot.v1.query.") and x.endswith(">") for x in p.publish)
    assert not {"allot.v1.query.queue", "allot.v1.query.status"} & set(p.publish)
    assert set(p.subscribe) == {
        "_INBOX_nlp.>",
        "allot.v1.events.nlp.>",
        "allot.v1.preempt.nlp.*",
        "allot.v1.queued.nlp.*",  # its work's queue positions
        "allot.v1.watched.nlp.*",
        "allot.v1.usage.idle.nlp.*",  # its runs flagged idle (USAGE, live)
        "allot.v1.ranking",
        "allot.v1.budget.tree",
    }
    # nothing of JetStream: the log is read through the services' watches
    assert not any(x.startswith("$") for x in p.publish + p.subscribe)
    assert "_INBOX.>" not in p.subscribe


@pytest.mark.parametrize(
    "user",
    [
        UserSpec("nlp", "team", allocations=("nlp",), unallocated=True),
        UserSpec("lead", "manager", node="research"),
        UserSpec("ops", "operator"),
        UserSpec("agent-1", "agent", hosts=("h01",)),
    ],
)
def test_every_user_but_the_services_is_denied_jetstream_and_the_service_durables(
    tree: BudgetTree, user: UserSpec
) -> None:
    """Consumers are the creator's choice of name, filter and delivery subject: a team that
    may create one can re-point accounting's durable or have the server publish anywhere."""
    p = permissions(user, tree)
    assert {"$JS.>", "$KV.>", "$SYS.>"} <= set(p.deny_publish)
    assert "$JS.API.CONSUMER.*.*.accounting" in p.deny_publish
    # DURABLE.CREATE and MSG.NEXT: two tokens before the stream
    assert "$JS.API.CONSUMER.*.*.*.accounting" in p.deny_publish
    assert not any(x.startswith("$") for x in p.publish)


def test_the_services_may_not_unmake_the_log_and_the_streams_login_only_makes_it(
    tree: BudgetTree,
) -> None:
    """Decision 0082: the services publish records, answers and the JetStream they use, not
    what deletes, purges, updates or creates a stream (a stream's limits and ``republish``
    are its update), nor a consumer's reset or pause, nor an API a later server adds; the
    streams login only reads, creates and updates streams, its answers in its own inbox."""
    svc = permissions(UserSpec("svc", "service"), tree, logins=("svc", "alice"))
    assert svc.subscribe == (">",)
    may = [
        "allot.v1.events.nlp.w1.placed",
        "_INBOX.x.1",
        "_INBOX_alice.x.1",  # answers in any login's inbox
        "$JS.API.STREAM.INFO.WORKLOADS",
        "$JS.API.STREAM.MSG.GET.USAGE",
        "$JS.API.DIRECT.GET.HOSTS",
        "$JS.API.CONSUMER.CREATE.WORKLOADS.w.allot.v1.events.nlp.*.*",
        "$JS.API.CONSUMER.DURABLE.CREATE.WORKLOADS.accounting",
        "$JS.API.CONSUMER.MSG.NEXT.WORKLOADS.accounting",
        "$JS.API.CONSUMER.DELETE.WORKLOADS.w",
        "$JS.ACK.WORKLOADS.accounting.1.2.3.4.5",
        "$JS.FC.WORKLOADS.x.y",
        "$KV.allot_leader.placement",
    ]
    may_not = [
        *(f"$JS.API.STREAM.{v}.WORKLOADS" for v in ("CREATE", "UPDATE", "DELETE", "PURGE")),
        "$JS.API.STREAM.MSG.DELETE.WORKLOADS",
        "$JS.API.STREAM.RESTORE.WORKLOADS",
        "$JS.API.STREAM.PEER.EVACUATE.WORKLOADS",
        "$JS.API.STREAM.CANCEL_MOVE.WORKLOADS",
        "$JS.API.CONSUMER.RESET.WORKLOADS.accounting",
        "$JS.API.CONSUMER.PAUSE.WORKLOADS.accounting",
        "$JS.API.ACCOUNT.PURGE.ALLOT",
        "$JS.API.META.LEADER.STEPDOWN",
        "$KV.other.key",
        "_INBOX_bob.x.1",  # no such login
        "evil.subject",
    ]
    assert [x for x in may if not allowed(svc, x, "send")] == []
    assert [x for x in may_not if allowed(svc, x, "send")] == []
    keeper = permissions(UserSpec("keeper", "streams"), tree)
    assert keeper.publish == (
        "$JS.API.STREAM.INFO.*",
        "$JS.API.STREAM.CREATE.*",
        "$JS.API.STREAM.UPDATE.*",
    )
    assert keeper.subscribe == ("_INBOX_keeper.>",)


def test_a_roles_file_without_a_streams_login_is_refused(tree: BudgetTree) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_roles({"users": [SERVICE]}, tree)
    assert exc.value.field == "users" and "'streams'" in exc.value.reason
    with pytest.raises(ValidationError) as exc:
        parse_roles({"users": [STREAMS]}, tree)
    assert exc.value.field == "users" and "'service'" in exc.value.reason


def test_unallocated_team_uses_the_tilde_token(tree: BudgetTree) -> None:
    p = permissions(UserSpec("batch", "team", unallocated=True), tree)
    assert "allot.v1.submit.~.batch" in p.publish and "allot.v1.events.~.>" in p.subscribe
    assert "allot.v1.queued.~.*" in p.subscribe


def test_manager_grant_is_strictly_below_the_node(tree: BudgetTree) -> None:
    assert permissions(UserSpec("m", "manager", node="research"), tree).publish[0] == (
        "allot.v1.budget.set.by.m.root.research.>"
    )
    # Cancels: the allocations of its subtree only (a leaf manager: its own allocation).
    for node in ("research", "root", *tree.leaves()):
        grants = permissions(UserSpec("m", "manager", node=node), tree).publish
        cancels = {g for g in grants if g.startswith("allot.v1.cancel.")}
        assert cancels == {
            f"allot.v1.cancel.{a}.*.manager.m" for a in subtree_allocations(tree, node)
        }, node
    assert subtree_allocations(tree, "root") == tree.leaves()
    research = set(subtree_allocations(tree, "research"))
    assert research and research < set(tree.leaves())
    assert all(tree.path(a).startswith(tree.path("research") + "/") for a in research)
    assert subtree_allocations(tree, tree.leaves()[0]) == (tree.leaves()[0],)
    assert permissions(UserSpec("m", "manager", node="root"), tree).publish[0] == (
        "allot.v1.budget.set.by.m.root.>"
    )


def test_budget_path_starts_at_root_whatever_the_tree_calls_it() -> None:
    org = parse_tree({"name": "org", "children": [{"name": "a", "shares": 1}]})
    assert budget_path(org, "a") == ("root", "a")


def test_agent_and_operator_grants(tree: BudgetTree) -> None:
    agent = permissions(UserSpec("a1", "agent", hosts=("h01", "h02")), tree)
    # Every grant is a literal subject of one of its own hosts: no wildcard, no log, no
    # JetStream API, nothing of another host.
    assert set(agent.publish) == {
        f"allot.v1.host.{h}.{kind}"
        for h in ("h01", "h02")
        for kind in ("heartbeat", "health", "report", "sync", "util")
    }
    assert agent.subscribe == ("_INBOX_a1.>", "allot.v1.host.h01.work", "allot.v1.host.h02.work")
    ops = permissions(UserSpec("o", "operator"), tree)
    assert set(ops.publish) == {
        "allot.v1.host.*.drain.o",
        "allot.v1.host.*.undrain.o",
        "allot.v1.cancel.*.*.operator.o",
        "allot.v1.query.>",
    }
    # the services: the record subjects, not everything (decision 0082)
    assert "allot.v1.>" in permissions(UserSpec("s", "service"), tree).publish
    assert ">" not in permissions(UserSpec("s", "service"), tree).publish


def test_the_dashboard_asks_queries_answers_in_the_askers_inboxes_and_has_no_jetstream(
    tree: BudgetTree,
) -> None:
    """The web-facing dashboard's login: queries (the log through ``query.history``), its
    answers in the inboxes of the logins that may ask; nothing of JetStream (any API grant
    steers the server's answers onto any subject), no record, command or stream change,
    and not ``allow_responses`` (it may ask its own subjects)."""
    data = roles(
        {"name": "dash", "role": "dashboard"},
        {"name": "nlp", "role": "team", "allocations": ["nlp"], "users": ["alice"]},
        {"name": "ops", "role": "operator"},
        {"name": "agent-1", "role": "agent", "hosts": ["h01"]},
    )
    users = parse_roles(data, tree)
    askers = [u.name for u in users if u.role in ASKERS]
    assert askers == ["alice", "ops", "svc"]
    p = permissions(users[0], tree, askers)
    assert p.subscribe == ("_INBOX_dash.>", "allot.v1.query.owed")
    inboxes = {"_INBOX_alice.>", "_INBOX_ops.>", "_INBOX_svc.>"}
    assert set(p.publish) == {"allot.v1.query.>", "allot.v1.dashboard.log", *inboxes}
    assert {"$JS.>", "$KV.>", "$JS.API.CONSUMER.*.*.accounting"} <= set(p.deny_publish)
    grants = {u.name: permissions(u, tree, askers) for u in users}
    text = render_config(users, grants, {u.name: "h" for u in users})
    assert "allow_responses" not in text
    # The askers' own grants do not change with them.
    assert grants["alice"] == permissions(users[1], tree)


# -- rendering and files ---------------------------------------------------------------------


def test_render_quotes_dollar_subjects_and_hashes(tree: BudgetTree) -> None:
    users = parse_roles(roles({"name": "nlp", "role": "team", "allocations": ["nlp"]}), tree)
    grants = {u.name: permissions(u, tree) for u in users}
    text = render_config(users, grants, {"nlp": "$2a$04$x", "svc": "$2a$04$y", "keeper": "$"})
    assert 'password: "$2a$04$x"' in text
    assert 'deny: ["$JS.>", "$KV.>"' in text
    assert "jetstream: enabled" in text and "tls {" not in text


def test_generate_writes_private_files_the_server_accepts(tree: BudgetTree, tmp_path: Path) -> None:
    data = roles(
        {"name": "nlp", "role": "team", "allocations": ["nlp"]},
        {"name": "lead", "role": "manager", "node": "research"},
        {"name": "ops", "role": "operator"},
        {"name": "a1", "role": "agent", "hosts": ["h01"]},
    )
    auth = generate(tree, data, tmp_path / "auth", cost=4, server_url="nats://127.0.0.1:4300")
    assert stat.S_IMODE(auth.config_path.stat().st_mode) == 0o600
    for creds in auth.users.values():
        assert stat.S_IMODE(creds.path.stat().st_mode) == 0o600
        env = creds.path.read_text()
        assert f"ALLOT_NATS_URL=nats://{creds.user}:{creds.password}@127.0.0.1:4300" in env
        assert creds.password not in auth.config_text  # only the bcrypt hash is
    assert auth.users["nlp"].inbox_prefix == "_INBOX_nlp"
    assert auth.users["svc"].inbox_prefix == "_INBOX_svc"
    # A cluster's route password: private, and URL-safe (route URLs carry it as a login)
    assert auth.route_env is not None
    assert stat.S_IMODE(auth.route_env.stat().st_mode) == 0o600
    (route_password,) = re.findall(r"(?m)^NATS_ROUTE_PASSWORD=(\S+)$", auth.route_env.read_text())
    assert re.fullmatch(r"[A-Za-z0-9_-]{32,}", route_password)
    assert all(route_password != c.password for c in auth.users.values())
    # kept across runs (a new one stalls a cluster's roll); a new one once the file is gone
    again = generate(tree, data, tmp_path / "auth", cost=4)
    assert again.route_env is not None and again.route_env.read_text() == auth.route_env.read_text()
    again.route_env.unlink()
    fresh = generate(tree, data, tmp_path / "auth", cost=4)
    assert fresh.route_env is not None and route_password not in fresh.route_env.read_text()
    # Redis's password (decision 0083): private, kept across runs too, no NATS password
    assert fresh.redis_env is not None and stat.S_IMODE(fresh.redis_env.stat().st_mode) == 0o600
    (redis_password,) = re.findall(r"(?m)^ALLOT_REDIS_PASSWORD=(\S+)$", fresh.redis_env.read_text())
    assert re.fullmatch(r"[A-Za-z0-9_-]{32,}", redis_password)
    assert redis_password not in {route_password, *(c.password for c in fresh.users.values())}
    kept = generate(tree, data, tmp_path / "auth", cost=4)
    assert kept.redis_env is not None and redis_password in kept.redis_env.read_text()
    assert auth.first("service").user == "svc"
    # nats-server's own config check (-t) accepts it
    result = subprocess.run(
        [str(find_nats_server()), "-t", "-c", str(auth.config_path)],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    again = generate(tree, data, tmp_path / "auth", cost=4)
    assert again.users["nlp"].password != auth.users["nlp"].password


def test_each_team_member_gets_its_own_password_file_inbox_and_dashboard_login(
    tree: BudgetTree, tmp_path: Path
) -> None:
    data = roles(
        {"name": "nlp", "role": "team", "allocations": ["nlp"], "users": ["alice", "bob"]},
    )
    auth = generate(tree, data, tmp_path / "auth", cost=4)
    assert set(auth.users) == {"alice", "bob", "svc", "keeper"}  # none named for the team
    alice, bob = auth.users["alice"], auth.users["bob"]
    assert alice.password != bob.password
    assert (alice.path.name, alice.inbox_prefix) == ("alice.env", "_INBOX_alice")
    assert "ALLOT_NATS_USER=bob" in bob.path.read_text()
    assert "# team: nlp (team nlp)" in auth.config_text
    dashboard = json.loads(auth.dashboard_users.read_text()) if auth.dashboard_users else {}
    assert dashboard["users"]["alice"]["role"] == "team"
    assert dashboard["users"]["alice"]["allocations"] == ["nlp"]
    assert "bob" in dashboard["users"] and "nlp" not in dashboard["users"]


@pytest.mark.parametrize(
    ("url", "environ", "login"),
    [
        ("nats://127.0.0.1:4222", {}, None),
        ("nats://alice:pw@127.0.0.1:4222", {}, "alice"),
        ("nats://alice:pw@127.0.0.1:4222", {"ALLOT_NATS_USER": "bob"}, "alice"),
        ("nats://127.0.0.1:4222", {"ALLOT_NATS_USER": "bob"}, "bob"),
        ("nats://n1:4222,tls://al%2Dice:p@n2:4222", {}, "al-ice"),
        ("nats://s3cret-token@127.0.0.1:4222", {}, None),  # a token is no name
    ],
)
def test_login_for_is_the_urls_user_or_the_environments(
    url: str, environ: dict[str, str], login: str | None
) -> None:
    assert login_for(url, environ) == login


def test_url_keeps_scheme_host_and_port(tree: BudgetTree, tmp_path: Path) -> None:
    auth = generate(tree, roles(), tmp_path, cost=4)
    creds = auth.users["svc"]
    assert creds.url("tls://localhost:4222") == f"tls://svc:{creds.password}@localhost:4222"
    with pytest.raises(ValidationError):
        creds.url("not a url")
    assert inbox_prefix_for_url(creds.url("nats://h:1")) == "_INBOX_svc"
    assert inbox_prefix_for_url("nats://h:1") == "_INBOX"


# -- the command -----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="allot")
    auth_cmd.register(p.add_subparsers(dest="command", required=True))
    return p


def test_cli_gen_with_the_example_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    args = _parser().parse_args(
        [
            "auth", "gen",
            "--budgets", str(deploy / "budgets.example.yaml"),
            "--roles", str(deploy / "roles.example.yaml"),
            "--out", str(tmp_path / "out"),
            "--cost", "4",
            "--tls",
        ]
    )  # fmt: skip
    assert args.func(args) == 0
    out = capsys.readouterr().out
    # nlp's members are logins of their own; robotics is one login named by its row
    assert "alice (team)" in out and "allot.v1.submit.nlp-pretrain.alice" in out
    assert "bob (team)" in out and "robotics (team)" in out and "nlp (team)" not in out
    assert (tmp_path / "out" / "nats.conf").is_file()
    assert (tmp_path / "out" / "tls" / "ca.pem").is_file()
    env = (tmp_path / "out" / "users" / "alice.env").read_text()
    assert "ALLOT_NATS_URL=tls://" in env
    # the CA to trust travels with the credentials: the env file alone is enough
    assert f"ALLOT_NATS_CA={(tmp_path / 'out' / 'tls' / 'ca.pem').resolve()}" in env.splitlines()
    assert not (tmp_path / "out" / "users" / "nlp.env").exists()


def test_cli_bad_roles_write_nothing(tmp_path: Path) -> None:
    roles_file = tmp_path / "roles.yaml"
    roles_file.write_text("users:\n  - {name: x, role: team, allocations: [nope]}\n")
    budgets = tmp_path / "b.yaml"
    budgets.write_text("name: root\nchildren:\n  - {name: nlp, shares: 1}\n")
    args = _parser().parse_args(
        [
            "auth",
            "gen",
            "--budgets",
            str(budgets),
            "--roles",
            str(roles_file),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    with pytest.raises(ValidationError) as exc:
        args.func(args)
    assert exc.value.field == "users[0].allocations[0]"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "nats://127.0.0.1:4222"),  # the default, as is
        ({"ALLOT_NATS_URL": "nats://nats:4222"}, "nats://nats:4222"),
        (
            {
                "ALLOT_NATS_URL": "nats://nats:4222",
                "ALLOT_NATS_USER": "a",
                "ALLOT_NATS_PASSWORD": "p",
            },
            "nats://a:p@nats:4222",
        ),
        (  # every server of a cluster list; characters that mean something in a URL escaped
            {
                "ALLOT_NATS_URL": "nats://n1:4222,tls://n2:4222",
                "ALLOT_NATS_USER": "svc",
                "ALLOT_NATS_PASSWORD": "p@ss:/",
            },
            "nats://svc:p%40ss%3A%2F@n1:4222,tls://svc:p%40ss%3A%2F@n2:4222",
        ),
        (  # a URL that names its user wins over the environment
            {
                "ALLOT_NATS_URL": "nats://b:q@nats:4222",
                "ALLOT_NATS_USER": "a",
                "ALLOT_NATS_PASSWORD": "p",
            },
            "nats://b:q@nats:4222",
        ),
        ({"ALLOT_NATS_USER": "a"}, "nats://127.0.0.1:4222"),  # no password: nothing added
    ],
)
def test_nats_url_from_env_adds_the_credentials_files_user(env: dict[str, str], url: str) -> None:
    assert nats_url_from_env(env, "nats://127.0.0.1:4222") == url


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "redis://127.0.0.1:6379"),
        ({"ALLOT_REDIS_URL": "redis://redis:6379/0"}, "redis://redis:6379/0"),
        (
            {"ALLOT_REDIS_URL": "redis://redis:6379/0", "ALLOT_REDIS_PASSWORD": "p@ss:/"},
            "redis://:p%40ss%3A%2F@redis:6379/0",
        ),
        (  # a user (Redis 6 ACL) keeps its name
            {"ALLOT_REDIS_URL": "rediss://allot@redis:6380", "ALLOT_REDIS_PASSWORD": "p"},
            "rediss://allot:p@redis:6380",
        ),
        (  # a URL with its own password wins
            {"ALLOT_REDIS_URL": "redis://:q@redis:6379", "ALLOT_REDIS_PASSWORD": "p"},
            "redis://:q@redis:6379",
        ),
        (  # a socket has no place for it in the URL's authority
            {"ALLOT_REDIS_URL": "unix:///run/redis.sock", "ALLOT_REDIS_PASSWORD": "p"},
            "unix:///run/redis.sock",
        ),
    ],
)
def test_redis_url_from_env_adds_the_password(env: dict[str, str], url: str) -> None:
    assert redis_url_from_env(env, "redis://127.0.0.1:6379") == url


def test_the_services_redis_url_help_never_shows_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ALLOT_REDIS_URL", "redis://redis:6379")
    monkeypatch.setenv("ALLOT_REDIS_PASSWORD", "s3cr%et")
    parser = base_parser("x", None)
    assert parser.parse_args([]).redis_url == "redis://:s3cr%25et@redis:6379"
    text = parser.format_help()
    assert "s3cr" not in text and "redis://:***@redis:6379" in text


def test_nats_url_help_never_shows_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOT_NATS_URL", "nats://n1:4222,nats://n2:4222")
    monkeypatch.setenv("ALLOT_NATS_USER", "nlp")
    monkeypatch.setenv("ALLOT_NATS_PASSWORD", "s3cr%et")
    parser = argparse.ArgumentParser()
    add_nats_url_argument(parser, "nats://127.0.0.1:4222")
    assert (
        parser.parse_args([]).nats_url
        == "nats://nlp:s3cr%25et@n1:4222,nats://nlp:s3cr%25et@n2:4222"
    )
    text = parser.format_help()
    assert "s3cr" not in text
    assert "nats://nlp:***@n1:4222,nats://nlp:***@n2:4222" in " ".join(text.split())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("tls://nlp:s3cret@127.0.0.1:4222", "tls://nlp:***@127.0.0.1:4222"),
        ("nats://a:p1@h1:4222, nats://b:p2@h2:4222", "nats://a:***@h1:4222,nats://b:***@h2:4222"),
        ("nats://token-only@h:4222", "nats://token-only@h:4222"),
    ],
)
def test_masked_url_hides_every_password(url: str, shown: str) -> None:
    assert masked_url(url) == shown


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: d / "missing.pem", "No such file or directory"),
        (lambda d: d, "Is a directory"),
        (
            lambda d: (d / "junk.pem", (d / "junk.pem").write_text("not a cert"))[0],
            "no certificate",
        ),
    ],
)
def test_an_unreadable_ca_file_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any, reason: str
) -> None:
    ca = make(tmp_path)
    monkeypatch.setenv(CA_ENV, str(ca))
    with pytest.raises(ValidationError) as err:
        client_tls("tls://127.0.0.1:4222")
    assert err.value.field == CA_ENV
    assert str(ca) in err.value.reason and reason in err.value.reason


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:4222", "redis://u:pw@127.0.0.1:6379", "nats://a:4222,https://b:4222"],
)
def test_a_url_of_another_protocol_is_bad_input(url: str) -> None:
    with pytest.raises(ValidationError) as err:
        bus.server_urls(url)
    assert err.value.field == "nats_url" and "is no NATS URL" in err.value.reason
    assert "pw" not in err.value.reason


@pytest.mark.parametrize("url", ["nats://a:4222", "tls://a:4222", "127.0.0.1:4222", "wss://a"])
def test_nats_urls_pass(url: str) -> None:
    assert bus.server_urls(url) == [url]


def test_cli_an_out_folder_that_cannot_be_made_names_out() -> None:
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    args = _parser().parse_args(
        [
            "auth", "gen",
            "--budgets", str(deploy / "budgets.example.yaml"),
            "--roles", str(deploy / "roles.example.yaml"),
            "--out", "/proc/allot-no-such/out",
        ]
    )  # fmt: skip
    with pytest.raises(ValidationError) as exc:
        args.func(args)
    assert exc.value.field == "--out" and "cannot write" in exc.value.reason


def test_a_service_of_its_own_sends_only_its_kinds_and_hears_only_its_subjects(
    tree: BudgetTree,
) -> None:
    """Decision 0084: each service's own login; the shared login stays for the tools."""
    users = parse_roles(
        roles(*({"name": f"allot-{n}", "role": "service", "service": n} for n in SERVICE_NAMES)),
        tree,
    )
    names = tuple(u.name for u in users)
    grants = {u.name: permissions(u, tree, logins=names) for u in users}
    sends = {
        "allot-intake": "allot.v1.events.nlp.w1.submitted",
        "allot-placement": "allot.v1.events.nlp.w1.placed",
        "allot-dispatch": "allot.v1.host.h01.work",
        "allot-health": "allot.v1.host.h01.state",
        "allot-ranking": "allot.v1.budget.tree",
    }
    for login, subject in sends.items():
        may = {
            u for u, g in grants.items() if u.startswith("allot-") and allowed(g, subject, "send")
        }
        # the one service that writes it (host states: placement's drains too)
        expected = {login} | ({"allot-placement"} if subject.endswith(".state") else set())
        assert may == expected, subject
    hears = {
        "allot-intake": "allot.v1.submit.nlp.alice",
        "allot-accounting": "allot.v1.query.usage",
        "allot-health": "allot.v1.host.h01.heartbeat",
        "allot-dispatch": "allot.v1.host.h01.report",
        "allot-placement": "allot.v1.query.queue.nlp",
        "allot-ranking": "allot.v1.budget.set.by.lead.root.research.nlp",
    }
    for login, subject in hears.items():
        may = {
            u
            for u, g in grants.items()
            if u.startswith("allot-") and allowed(g, subject, "receive")
        }
        assert may == {login}, subject
    for login, g in grants.items():
        if not login.startswith("allot-"):
            continue
        assert allowed(g, f"_INBOX_{login}.x", "receive") and not allowed(
            g, "_INBOX_svc.x", "receive"
        )
        assert allowed(g, "_INBOX_svc.x", "send")  # answers in every login's inbox
        assert not allowed(g, "$JS.API.STREAM.DELETE.WORKLOADS", "send")
        assert allowed(g, "$JS.API.CONSUMER.CREATE.WORKLOADS", "send")
    assert allowed(grants["allot-accounting"], "$JS.ACK.WORKLOADS.accounting.1.2.3.4.5", "send")
    assert not allowed(grants["allot-dispatch"], "$JS.ACK.WORKLOADS.accounting.1.2.3.4.5", "send")
    assert allowed(grants["allot-placement"], "$KV.allot_leader.placement", "send")
    assert not allowed(grants["allot-intake"], "$KV.allot_leader.placement", "send")
    auth_users = {u.name: u for u in users}
    assert auth_users["svc"].service is None and auth_users["allot-health"].service == "health"


def test_a_service_login_names_a_known_service_and_the_shared_login_stays(
    tree: BudgetTree,
) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_roles(roles({"name": "x", "role": "service", "service": "scheduler"}), tree)
    assert exc.value.field == "users[0].service" and "placement" in exc.value.reason
    with pytest.raises(ValidationError) as exc:  # only services of their own: no shared one
        parse_roles(
            {"users": [{"name": "x", "role": "service", "service": "intake"}, STREAMS]}, tree
        )
    assert exc.value.field == "users" and "no 'service' field" in exc.value.reason
