"""Twin parity measured (docs/decisions/0051): record a live history, replay it through the
core's ``run_cycle`` with ``allot twin``, print the figures.

    python bench/twin_parity.py demo              # make run's workload (allot demo)
    python bench/twin_parity.py bench [ARGS...]   # bench/bench_live.py ARGS (--no-write added)

Starts its own embedded NATS and Redis on free ports (never the machine's), so the log
outlives the stack the workload starts and stops; runs the workload against them; then
``allot twin --since`` over the whole run, with the stack's knobs, saving the history to
``--save`` (default ``out/twin/<workload>.jsonl``, replayable with ``allot twin --from``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from allot.adapters.embedded import EmbeddedNats, EmbeddedRedis, unwind_on_sigterm

ROOT = Path(__file__).resolve().parent.parent
KNOBS = {
    # allot demo's stack (allot.cli.demo_cmd)
    "demo": ["--grace-s", "3", "--unallocated-grace-s", "1", "--unallocated-settle-s", "1"],
    # bench_live's stack: allot.ops.stack's defaults
    "bench": [],
}


def workload(
    name: str, extra: list[str], nats_url: str, redis_url: str, run_dir: Path
) -> list[str]:
    servers = ["--nats-url", nats_url, "--redis-url", redis_url]
    if name == "demo":
        return [sys.executable, "-m", "allot.cli.main", "demo", "--run-dir", str(run_dir), *servers]
    return [sys.executable, str(ROOT / "bench" / "bench_live.py"), "--no-write", *servers, *extra]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("workload", choices=sorted(KNOBS))
    ap.add_argument("--save", type=Path, help="where the history goes (JSON lines)")
    args, extra = ap.parse_known_args(argv)
    if extra and args.workload != "bench":
        ap.error(f"only bench takes more arguments (bench_live.py's), got {' '.join(extra)}")
    unwind_on_sigterm()
    save = args.save or ROOT / "out" / "twin" / f"{args.workload}.jsonl"
    save.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="allot-twin-") as tmp,
        EmbeddedNats(store_dir=Path(tmp) / "js") as nats,
        EmbeddedRedis() as redis,
    ):
        began = time.time()
        command = workload(args.workload, extra, nats.url, redis.url, Path(tmp) / "run")
        print(f"recording: {' '.join(command[1:])}", flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=tmp)
        since = f"{int(time.time() - began) + 60}s"
        twin = [sys.executable, "-m", "allot.cli.main", "twin", "--since", since]
        twin += ["--nats-url", nats.url, "--save", str(save), *KNOBS[args.workload]]
        print(f"replaying: allot twin --since {since} {' '.join(KNOBS[args.workload])}", flush=True)
        done = subprocess.run([*twin, "--json"], check=True, capture_output=True, text=True)
    data = json.loads(done.stdout)["data"]
    shown = ("placements", "notices", "cycles", "largest_lag_s", "tolerance_s")
    print(json.dumps({k: data[k] for k in shown}, indent=2))
    print(
        json.dumps(
            {
                k: {"cycles": v["cycles"], "placements": v["placements"]}
                for k, v in data["kinds"].items()
            },
            indent=2,
        )
    )
    print(f"history saved: {save} (allot twin --from {save} {' '.join(KNOBS[args.workload])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
