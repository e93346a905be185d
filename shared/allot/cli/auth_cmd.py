"""``allot auth gen``: the NATS authorization of a deployment from its budget tree and roles.

Writes ``OUT/nats.conf`` (accounts, users with bcrypt password hashes, per-user allow
lists; see ``allot.ops.auth_gen``) and ``OUT/users/<user>.env`` (the user's password,
a ready ``ALLOT_NATS_URL`` and the dashboard password ``ALLOT_DASHBOARD_PASSWORD``) and
``OUT/dashboard-users.json`` (the dashboard's logins: the same users, the hashes of their
dashboard passwords, ``python -m allot.services.dashboard --users``) and
``OUT/nats-route.env`` (the password a NATS cluster's servers log in to each other's
routes with: deploy/k8s), ``OUT/redis.env`` (Redis's password, ``ALLOT_REDIS_PASSWORD``:
deploy/k8s), all 0600, and prints one line per user with what it may do.
``--tls`` also writes a loopback CA and server certificate into ``OUT/tls`` and adds the
``tls`` block. Every user's password is new on each run; the routes' and Redis's are kept while
``OUT/nats-route.env`` and ``OUT/redis.env`` exist.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from allot.config.budget_file import load_tree_file
from allot.config.yaml_io import load_yaml
from allot.core.errors import ValidationError
from allot.ops.auth_gen import (
    ACCOUNT,
    DEFAULT_BCRYPT_COST,
    GeneratedAuth,
    TlsFiles,
    generate,
    parse_roles,
)
from allot.sim.output_files import make_out_dir


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "auth",
        help="NATS users and permissions for a deployment",
        description="Security: generate the nats-server authorization (users, passwords, "
        "per-subject permissions) from the budget tree and a roles file.",
    )
    sub = p.add_subparsers(dest="auth_command", metavar="ACTION", required=True)
    g = sub.add_parser(
        "gen",
        help="write nats.conf and one credentials file per user",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("--budgets", type=Path, required=True, help="budget tree YAML (nested form)")
    g.add_argument("--roles", type=Path, required=True, help="roles YAML (users and roles)")
    g.add_argument("--out", type=Path, required=True, help="output folder")
    g.add_argument(
        "--server",
        default="nats://127.0.0.1:4222",
        help="server URL written into each user's ALLOT_NATS_URL (default %(default)s)",
    )
    g.add_argument("--tls", action="store_true", help="also make loopback TLS certificates")
    g.add_argument(
        "--cost", type=int, default=DEFAULT_BCRYPT_COST, help="bcrypt cost (default %(default)s)"
    )
    g.set_defaults(func=run_gen)


def run_gen(args: argparse.Namespace) -> int:
    if not 4 <= args.cost <= 31:
        raise ValidationError("--cost", f"bcrypt cost must be 4..31, got {args.cost}")
    if args.out.exists() and not args.out.is_dir():
        raise ValidationError("--out", f"{args.out} exists and is not a folder")
    tree = load_tree_file(args.budgets, f"--budgets {args.budgets}")
    roles_data = load_yaml(args.roles)
    users = parse_roles(roles_data, tree)  # errors before anything is written
    make_out_dir(args.out, "--out")
    tls: TlsFiles | None = None
    server = args.server
    if args.tls:
        from allot.ops.tls_certs import make_loopback_certs  # noqa: PLC0415 (optional dep)

        # Absolute paths: nats-server reads them relative to its own working directory.
        tls = make_loopback_certs(args.out.resolve() / "tls")
        if server.startswith("nats://"):
            server = "tls://" + server.removeprefix("nats://")
    auth = generate(tree, users, args.out, server_url=server, tls=tls, cost=args.cost)
    print(summary(auth, tls))
    return 0


def summary(auth: GeneratedAuth, tls: TlsFiles | None) -> str:
    """What was written and, per user, what it may publish and subscribe to."""
    lines = [f"wrote {auth.config_path} ({len(auth.users)} users, account {ACCOUNT})"]
    if auth.dashboard_users is not None:
        lines.append(
            f"dashboard logins (the same users, each with the password of its file's "
            f"ALLOT_DASHBOARD_PASSWORD): {auth.dashboard_users}"
        )
    if auth.route_env is not None:
        lines.append(f"a NATS cluster's route password (deploy/k8s): {auth.route_env}")
    if auth.redis_env is not None:
        lines.append(f"Redis's password (deploy/k8s: requirepass): {auth.redis_env}")
    if tls is not None:
        lines.append(f"TLS: server certificate {tls.cert_file}; clients trust {tls.ca_file}")
    for name, creds in auth.users.items():
        grant = auth.grants[name]
        lines.append(f"{name} ({creds.role}): credentials {creds.path}")
        lines.append(f"  publish:   {' '.join(grant.publish)}")
        lines.append(f"  subscribe: {' '.join(grant.subscribe)}")
    return "\n".join(lines)
