"""The figures of a twin parity replay (``allot twin``, its ``--json``): placements and
notices identical at the natural cut (``exact``) or within the timing tolerance, different,
made by the replay alone; cycles by verdict; each kind of difference with the cycles and
placements it explains, and what it means; every cycle not identical, both sides' decisions.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from allot.eventlog.twin import KINDS, CycleParity, Decisions, Parity, Verdict


def figures(parity: Parity) -> dict[str, Any]:
    """See the module docstring."""
    placed: Counter[str] = Counter()
    noticed: Counter[str] = Counter()
    kinds: dict[str, Counter[str]] = {}
    for c in parity.cycles:
        same_p, same_n = c.identical_placements, c.identical_notices
        # Identical at the natural cut, or at an earlier one (within the tolerance).
        where = "exact" if c.dropped == 0 else "within_tolerance"
        placed["live"] += len(c.live.placements)
        placed[where] += same_p
        placed["different"] += len(c.live.placements) - same_p
        placed["replay_only"] += c.replay_only
        noticed["live"] += len(c.live.notices)
        noticed[where] += same_n
        noticed["different"] += len(c.live.notices) - same_n
        noticed["replay_only"] += len(set(c.replay.notices) - set(c.live.notices))
        if c.kind is not None:
            k = kinds.setdefault(c.kind, Counter())
            k["cycles"] += 1
            # Within the tolerance, the kind explains the cycle's placements; otherwise
            # it explains those that differ (either side's).
            if c.verdict is Verdict.WITHIN_TOLERANCE:
                k["placements"] += same_p
            else:
                k["placements"] += len(c.live.placements) - same_p + c.replay_only
    lags = [c.lag_s for c in parity.cycles if c.lag_s is not None]
    return {
        "window": {
            "since": parity.since if math.isfinite(parity.since) else None,
            "until": parity.until if math.isfinite(parity.until) else None,
        },
        "records": parity.records,
        "tolerance_s": parity.tolerance_s,
        "largest_lag_s": max(lags) if lags else None,
        "fraction_identical": parity.fraction_identical,
        "placements": _totals(placed),
        "notices": _totals(noticed),
        "cycles": {
            "compared": len(parity.cycles),
            **{v.value: sum(c.verdict is v for c in parity.cycles) for v in Verdict},
            "interleaved": sum(c.interleaved for c in parity.cycles),
        },
        "kinds": {kind: {**counts, "meaning": KINDS[kind]} for kind, counts in kinds.items()},
        "differences": [
            _cycle_json(c) for c in parity.cycles if c.verdict is not Verdict.IDENTICAL
        ],
    }


def _totals(counts: Counter[str]) -> dict[str, Any]:
    live, extra = counts["live"], counts["replay_only"]
    same = counts["exact"] + counts["within_tolerance"]
    return {
        "live": live,
        "identical": same,
        "exact": counts["exact"],
        "within_tolerance": counts["within_tolerance"],
        "different": counts["different"],
        "replay_only": extra,
        "fraction_identical": same / (live + extra) if live + extra else 1.0,
    }


def _decisions_json(d: Decisions) -> dict[str, Any]:
    return {
        "placements": [
            {"workload": p.workload_id, "hosts": {h: list(g) for h, g in p.assignment}}
            for p in d.placements
        ],
        "notices": [
            {
                "workload": n.workload_id,
                "reason": n.reason,
                "deadline": n.deadline,
                "preemptor": n.preemptor,
            }
            for n in d.notices
        ],
        "drains": list(d.drains),
    }


def _cycle_json(c: CycleParity) -> dict[str, Any]:
    return {
        "epoch": c.epoch,
        "at": c.at,
        "verdict": c.verdict.value,
        "kind": c.kind,
        "lag_s": c.lag_s,
        "dropped": c.dropped,
        "interleaved": c.interleaved,
        "live": _decisions_json(c.live),
        "replay": _decisions_json(c.replay),
    }
