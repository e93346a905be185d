"""What keeps an agent's NATS login from its workloads, piece by piece: the process turns
non-dumpable (``process_guard``) while what it starts does not, a part's environment
withholds every variable holding the agent's password or token (``gpu_exec``), and a
password given on the command line is called out (``service``). The whole, with a real
agent and workload: ``tests/integration/test_agent_secrets.py``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from allot.services.agent.gpu_exec import agent_secrets, workload_env
from allot.services.agent.service import password_on_command_line

SECRET = "pa55:w/rd-0123456789"
ENCODED = "pa55%3Aw%2Frd-0123456789"
URL = f"nats://agent-h01:{ENCODED}@nats:4222"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_agent_process_turns_non_dumpable_and_what_it_starts_does_not() -> None:
    """``execve`` makes a process dumpable again: the agent's sweep still reads its parts'
    environments, and a workload is no harder to debug than elsewhere."""
    script = (
        "import ctypes, subprocess, sys\n"
        "from allot.services.agent.process_guard import forbid_inspection\n"
        "why = forbid_inspection()\n"
        "again = forbid_inspection()\n"
        "libc = ctypes.CDLL(None)\n"
        "child = subprocess.run([sys.executable, '-c', 'import ctypes; "
        "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))'], capture_output=True, text=True)\n"
        "print(why, again, libc.prctl(3, 0, 0, 0, 0), child.stdout.strip())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    # Done (twice: idempotent), this process not dumpable (0), its child dumpable (1).
    assert out.stdout.split() == ["None", "None", "0", "1"]


@pytest.mark.parametrize(
    ("url", "environ", "expected"),
    [
        ("nats://nats:4222", {}, set()),
        (URL, {}, {ENCODED, SECRET}),
        ("tls://s3cr3t-token-value@a:1,nats://b:2", {}, {"s3cr3t-token-value"}),
        ("nats://nats:4222", {"ALLOT_NATS_PASSWORD": "from-env-9876"}, {"from-env-9876"}),
        ("nats://x:4222", {"ALLOT_NATS_URL": "nats://u:envpass123@y:1"}, {"envpass123"}),
    ],
    ids=["no-login", "password-encoded-and-not", "token", "password-variable", "url-variable"],
)
def test_the_agents_secrets_are_its_passwords_and_tokens_not_its_user(
    url: str, environ: dict[str, str], expected: set[str]
) -> None:
    assert agent_secrets(url, environ) == expected


def _env(base: dict[str, str], nats_url: str = URL) -> dict[str, str]:
    return workload_env(
        base, gpus=(0,), workload_id="w1", allocation="nlp", attempt=1, nats_url=nats_url, host="h"
    )


def test_a_variable_holding_the_agents_password_under_any_name_is_withheld() -> None:
    env = _env(
        {
            "PATH": "/usr/bin",
            "NATS_URL": URL,  # a copy for the nats CLI
            "NATS_PASSWORD": SECRET,
            "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Basic {SECRET}",
            "TEAM": "nlp",
        }
    )
    assert not [k for k, v in env.items() if SECRET in v or ENCODED in v]
    assert {"PATH", "TEAM"} <= env.keys()
    assert not {"NATS_URL", "NATS_PASSWORD", "OTEL_EXPORTER_OTLP_HEADERS"} & env.keys()
    assert env["ALLOT_NATS_URL"] == "nats://nats:4222"


def test_a_short_password_withholds_only_a_variable_that_is_exactly_it() -> None:
    env = _env({"PWD": "/home/test", "PASS": "test"}, "nats://u:test@n:4222")
    assert env["PWD"] == "/home/test"  # "test" inside it is a coincidence, not a leak
    assert "PASS" not in env


def test_the_submissions_own_env_is_the_users_and_passed_as_given() -> None:
    """A team's variables come from its submission, never from the agent: withholding
    applies to what the agent inherited only."""
    env = workload_env(
        {},
        gpus=(0,),
        workload_id="w1",
        allocation="nlp",
        attempt=1,
        nats_url="nats://n:4222",
        host="h",
        extra={"MY_TOKEN": "team-own-value"},
    )
    assert env["MY_TOKEN"] == "team-own-value"


@pytest.mark.parametrize(
    ("url", "environ", "warned"),
    [
        ("nats://agent:pw@n:4222", {}, True),
        ("nats://n:4222", {}, False),
        ("nats://agent:pw@n:4222", {"ALLOT_NATS_URL": "nats://agent:pw@n:4222"}, False),
        (
            "nats://agent:pw@n:4222",
            {"ALLOT_NATS_URL": "nats://n:4222", "ALLOT_NATS_USER": "agent"}
            | {"ALLOT_NATS_PASSWORD": "pw"},
            False,
        ),
    ],
    ids=["password-in-the-option", "no-password", "url-from-env", "user-and-password-from-env"],
)
def test_a_password_on_the_command_line_is_called_out(
    url: str, environ: dict[str, str], warned: bool
) -> None:
    assert password_on_command_line(url, environ) is warned
