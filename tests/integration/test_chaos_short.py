"""A short fault-injection run inside the normal suite (the long one is ``make chaos``).

The whole stack as processes, a steady load of 8 submissions/s recorded as a history,
one SIGKILL of the placement leader and one of intake (each restarted at once), then the
checker (``checker``) over the history and the whole log: nothing acknowledged
is lost, no attempt is placed twice, no GPU is held by two workloads, no decision of a
stale epoch is applied, epochs strictly increase, every acknowledged workload was placed,
and the system recovered from each fault.

The driver is ``bench/chaos.py`` (loaded by path: ``bench`` is not a package).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from bench_scripts import load as load_bench

pytestmark = pytest.mark.integration


async def test_leader_and_intake_killed_under_load_nothing_lost_nothing_double_booked(
    fresh_log: str, redis_url: str, tmp_path: Path
) -> None:
    chaos = load_bench("chaos")
    cfg = chaos.ChaosConfig(
        run_dir=tmp_path,
        plan=["sigkill:leader", "sigkill:intake"],
        nats_url=fresh_log,
        redis_url=redis_url,
        # 8/s x ~2 GPUs x ~2 s is ~32 GPUs busy of 64: the queue drains between faults.
        agents=1,
        hosts=8,
        gpus=8,
        rate=8.0,
        warmup_s=2.0,
        settle_s=2.0,
        recovery_timeout_s=15.0,
        drain_timeout_s=15.0,
        quiesce_timeout_s=20.0,
        redis_prefix=f"chaos{uuid.uuid4().hex[:8]}",
    )
    result = await chaos.run(cfg, log=lambda _: None)
    rep = result.report
    figures = rep.figures()

    assert result.quiescent, result.notes
    assert rep.violations == [], rep.violations[:10]
    assert rep.acknowledged >= 40, figures  # ~8 s of load at 8/s, minus intake's outage
    assert rep.lost == 0 and rep.unexpected == 0
    assert rep.double_placements == 0 and rep.gpu_double_booked == 0
    assert rep.stale_decisions_applied == 0
    assert rep.unplaced == 0
    # Accounting (never killed here) charged exactly the GPU-seconds the agents reported.
    assert result.accounting["match"], result.accounting
    # The leader was killed: a second leader took over with a greater epoch.
    assert len(rep.epochs) >= 2 and rep.epochs == sorted(set(rep.epochs))
    # Both faults were injected and recovered from (a standby takes over after one lease
    # TTL of 1 s; a restarted intake answers within a couple of seconds).
    kinds = [(r.kind, r.seconds) for r in rep.recoveries]
    assert [k for k, _ in kinds] == ["sigkill:leader", "sigkill:intake"]
    assert all(sec is not None and sec < 10.0 for _, sec in kinds), kinds
