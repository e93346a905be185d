"""``python -m allot.services.agent``."""

from allot.services.agent.process_guard import forbid_inspection

# Before the heavy imports: from its execve on, the agent's environment holds its NATS
# password, and a workload of an earlier agent process may still run as the same user
# until the new agent's sweep ends it. ``main`` calls it again and logs the outcome.
forbid_inspection()

from allot.services.agent.service import main  # noqa: E402  (after the call above, on purpose)

raise SystemExit(main())
