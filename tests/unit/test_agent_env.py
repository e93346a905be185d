"""``allot.services.agent.gpu_exec.workload_env``: what a part's process is told, and what it must
never inherit from its agent (the agent's NATS login, its Redis URL)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from allot.proto import messages as m
from allot.services.agent.gpu_exec import without_userinfo, workload_env

AGENT_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/home/agent",
    "ALLOT_NATS_URL": "nats://agent-h01:s3cret@nats:4222",
    "ALLOT_NATS_USER": "agent-h01",
    "ALLOT_NATS_PASSWORD": "s3cret",
    "ALLOT_REDIS_URL": "redis://:redispw@redis:6379/0",
    "ALLOT_NATS_INBOX_PREFIX": "_INBOX_agent-h01",
    "ALLOT_LOG_LEVEL": "debug",
    "ALLOT_NATS_CA": "/etc/allot/ca.pem",
}


def _env(nats_url: str = "nats://agent-h01:s3cret@nats:4222", **kw: object) -> dict[str, str]:
    args: dict[str, object] = {
        "gpus": (2, 3),
        "workload_id": "w1",
        "allocation": "nlp",
        "attempt": 2,
        "nats_url": nats_url,
        "host": "h01",
    }
    args.update(kw)
    return workload_env(AGENT_ENV, **args)  # type: ignore[arg-type]


def test_a_workload_gets_no_credential_of_its_agent() -> None:
    env = _env()
    assert env["ALLOT_NATS_URL"] == "nats://nats:4222"  # where NATS is, not who the agent is
    for secret in (
        "ALLOT_NATS_USER",
        "ALLOT_NATS_PASSWORD",
        "ALLOT_REDIS_URL",
        "ALLOT_NATS_INBOX_PREFIX",
        "ALLOT_LOG_LEVEL",
    ):
        assert secret not in env, secret
    assert not any("s3cret" in v or "redispw" in v for v in env.values())
    # The CA's path is no secret, and a workload needs it to reach a TLS server.
    assert env["ALLOT_NATS_CA"] == "/etc/allot/ca.pem"
    assert (env["PATH"], env["HOME"]) == ("/usr/bin", "/home/agent")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert (env["ALLOT_WORKLOAD_ID"], env["ALLOT_ATTEMPT"]) == ("w1", "2")
    assert (env["ALLOT_ALLOCATION"], env["ALLOT_HOST"]) == ("nlp", "h01")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://u:p@127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("tls://token@nats.example:4222", "tls://nats.example:4222"),
        ("nats://u%40x:p%3A@a:1, nats://u:p@b:2", "nats://a:1,nats://b:2"),  # a cluster
        ("nats://u:p@[::1]:4222", "nats://[::1]:4222"),
    ],
    ids=["no-user", "user-and-password", "token", "every-server-of-a-cluster", "ipv6"],
)
def test_the_nats_url_loses_its_userinfo(url: str, expected: str) -> None:
    assert without_userinfo(url) == expected
    assert _env(nats_url=url)["ALLOT_NATS_URL"] == expected


@pytest.mark.parametrize(
    ("host", "hosts", "rank"),
    [
        ("h01", ("h01",), 0),
        ("h01", ("h01", "h03", "h02"), 0),  # the primary is rank 0
        ("h02", ("h01", "h03", "h02"), 2),  # the others in the assignment's order
    ],
    ids=["single-host", "gang-primary", "gang-third-part"],
)
def test_every_part_of_a_gang_learns_its_hosts_and_rank(
    host: str, hosts: Sequence[str], rank: int
) -> None:
    env = _env(host=host, hosts=hosts)
    assert env["ALLOT_HOSTS"] == ",".join(hosts)
    assert env["ALLOT_HOST_RANK"] == str(rank)
    assert env["ALLOT_NUM_HOSTS"] == str(len(hosts))
    assert env["ALLOT_HOST"] == host


def test_without_the_assignment_no_gang_variable_is_guessed() -> None:
    env = _env()
    assert not {"ALLOT_HOSTS", "ALLOT_HOST_RANK", "ALLOT_NUM_HOSTS"} & env.keys()


def test_the_submissions_env_is_added_and_what_the_agent_sets_wins() -> None:
    env = _env(extra={"TEAM_TAG": "t1", "PATH": "/opt/venv/bin", "CUDA_VISIBLE_DEVICES": "0-7"})
    assert env["TEAM_TAG"] == "t1"
    assert env["PATH"] == "/opt/venv/bin"  # over the agent's own environment
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # never over what the agent sets


def test_the_reserved_names_are_exactly_what_the_agent_sets() -> None:
    """Intake refuses ``RESERVED_ENV`` in a submission; that list must follow
    ``workload_env`` (every variable it sets, whatever the agent's own environment)."""
    env = workload_env(
        {"ALLOT_NATS_CA": "/ca.pem"},
        gpus=(0,),
        workload_id="w1",
        allocation="nlp",
        attempt=1,
        nats_url="nats://n:4222",
        host="h1",
        hosts=("h1", "h2"),
        agent="1:2",
        checkpoint_dir="/ck/nlp/w1",
        session_dir="/tmp/s/w1",
    )
    assert set(env) == set(m.RESERVED_ENV)
