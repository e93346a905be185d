"""The leader lease and epochs: one placement instance decides at a time.

The lease is a key in NATS KV (bucket ``allot_leader``, key ``placement``, TTL
``lease_ttl_s``), taken with ``create`` (fails while it is held) and renewed with
``update(last=revision)``. The revision of the winning ``create`` is the leader's
**epoch**, strictly increasing. The new leader appends ``LeaderElected(epoch)`` and acts
only once its own fold has applied it (``claim_epoch``); every decision carries the epoch
and folds ignore decisions of older epochs, so a paused old leader cannot double-book GPUs
(fencing). Why the loop outlives every NATS error:
docs/decisions/0004-the-lease-loop-outlives-nats-errors.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

import structlog
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from allot import bus
from allot.bus.runtime import wall_clock
from allot.eventlog.logfold import LogFold
from allot.proto import messages as m
from allot.proto import subjects as s

LEASE_KEY = "placement"

log = structlog.get_logger("allot.placement")


class Candidate(Protocol):
    """The service that leads while it holds the lease."""

    @property
    def leader(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...

    async def take_leadership(self, epoch: int) -> bool:
        """Lead as ``epoch``; False if the log shows a newer one (the lease is let go)."""
        ...

    async def step_down(self, why: str) -> None: ...


async def hold_lease(js: JetStreamContext, candidate: Candidate, name: str, ttl_s: float) -> None:
    """Take the lease when it is free, renew it while leading, until ``candidate`` stops.
    Nothing NATS raises may end this task: a dead lease loop is an instance that never
    leads again. When taking leadership fails, the lease is let go and taken again."""
    kv = None
    while kv is None and not candidate.stopping:
        try:
            kv = await bus.lease_bucket(js, ttl_s)
        except Exception as e:  # NATS unavailable, or the bucket not made yet: retry
            log.warning("lease bucket not ready", error=str(e) or repr(e))
            await asyncio.sleep(ttl_s / 4)
    if kv is None:
        return
    revision = 0
    while not candidate.stopping:
        if not candidate.leader:
            try:
                revision = await kv.create(LEASE_KEY, name.encode())
            except KeyWrongLastSequenceError:
                await asyncio.sleep(ttl_s / 4)
                continue
            except Exception as e:  # NATS unavailable: retry
                log.warning("lease create failed", error=str(e))
                await asyncio.sleep(ttl_s / 4)
                continue
            try:
                taken = await candidate.take_leadership(revision)
            except Exception as e:  # the LeaderElected append failed: let the lease go
                log.warning("leadership not taken", epoch=revision, error=repr(e))
                await candidate.step_down(f"taking leadership failed: {e!r}")
                with contextlib.suppress(Exception):
                    await kv.delete(LEASE_KEY)
                await asyncio.sleep(ttl_s / 4)
                continue
            if not taken:
                with contextlib.suppress(Exception):
                    await kv.delete(LEASE_KEY)
        else:
            await asyncio.sleep(ttl_s / 3)
            try:
                revision = await kv.update(LEASE_KEY, name.encode(), last=revision)
            except Exception as e:
                await candidate.step_down(f"lease lost: {e}")


async def claim_epoch(
    js: JetStreamContext, follower: bus.LogFollower, fold: LogFold, epoch: int, name: str
) -> int | None:
    """Append ``LeaderElected(epoch)`` and wait until ``fold`` (fed by ``follower``) has
    applied it: the record's WORKLOADS sequence, or None when the log shows a newer epoch
    (another instance won since)."""
    record = m.LeaderElected(epoch=epoch, leader=name, at=wall_clock())
    seq = await bus.publish(js, s.LEADER, record, f"leader:{epoch}")
    await follower.wait_for("WORKLOADS", seq, timeout=10.0)
    if fold.epoch != epoch:
        log.warning("elected but the log shows a newer epoch", ours=epoch, log=fold.epoch)
        return None
    return seq
