"""Run every benchmark, print a summary table, and write ``bench/results/latest.{md,json}``.

Called by ``make bench`` as ``python bench/run_all.py --shared ../shared``. Each benchmark
runs in its own subprocess, so the peak RSS reported for it (``ru_maxrss`` of that child,
from ``os.wait4``) is its own:

==========================  ===============================================  ==============
benchmark                   figure                                           target
==========================  ===============================================  ==============
``bench_cycle.py``          median ``run_cycle`` (1,000 hosts x 8 GPUs,      <= 50 ms
                            10,000 pending), two layouts: ``mixed`` and
                            ``--layout full`` (bench-live's full cluster);
                            ``mixed`` scaled 10x (10,000 hosts, 100,000      <= 250 ms,
                            pending) and its time over the 1x one (1x and    <= 12x
                            10x in ``CYCLE_PAIRS`` back-to-back pairs of
                            processes: medians, and the median pair ratio)
``bench_hosts.py``          median fold of the HOSTS log: 10,000 hosts       <= 1,000 ms
                            joining in random order, then drains
``bench_fairshare.py``      median Fair Tree ``rank`` over 1,000 allocations <= 5 ms
``bench_reasons.py``        median uncached ``allot queue`` answer: dry        <= 200 ms
                            ``run_cycle`` + ``queue_order`` +
                            ``explain_pending`` (1,000 hosts x 8 GPUs, 90%
                            busy, 10,000 pending); also writes
                            ``bench/results/reasons.{md,json}``
``bench_philly.py``         full Philly trace (82,247 jobs, 352 x 8 GPUs,    <= 30 s,
                            fairshare + preemption): wall time, peak RSS     <= 1 GiB;
                            and contended, on 80 hosts (``--hosts 80``)      <= 60 s
==========================  ===============================================  ==============

The first four print their median as text (``median X ms``), which is parsed here; the
Philly benchmark writes its figures as JSON. No timeout anywhere: the simulator may take
minutes. The results (figures, targets, machine: nproc, Python, platform, CPU, date,
commit) are written even when a target is missed; the exit status is then 1 (2 when a
benchmark failed to produce its figure).

``--limit-days N`` is passed to the Philly benchmark for a quick run; its targets are then
not judged (they are about the full trace).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from allot import compiled_core
from bench_cycle import machine_reference_s  # a sibling script (sys.path[0])

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
CYCLE_PAIRS = 3
"""Back-to-back 1x/10x pairs of ``bench_cycle.py`` processes (see ``main``)."""
MEDIAN_MS = re.compile(r"median\s+([0-9]+(?:\.[0-9]+)?)\s*ms")


@dataclass
class Figure:
    metric: str
    value: float | None
    unit: str
    target: float
    passed: bool | None  # None: not judged (partial run) or not measured


@dataclass
class Result:
    name: str
    script: str
    what: str
    exit_code: int
    wall_s: float
    peak_rss_mib: float
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def run_child(argv: list[str]) -> tuple[int, str, float, float]:
    """Run ``argv`` to completion, echoing its output live; return (exit code, output,
    wall seconds, peak RSS MiB of that child alone)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code  # reaped here: tell Popen not to wait again
    wall = time.perf_counter() - started
    rss = usage.ru_maxrss / (1024 * 1024) if sys.platform == "darwin" else usage.ru_maxrss / 1024
    return code, "".join(lines), wall, rss


def median_bench(
    name: str, script: str, what: str, target_ms: float, args: tuple[str, ...] = ()
) -> Result:
    code, output, wall, rss = run_child([sys.executable, str(BENCH / script), *args])
    result = Result(name, script, what, code, round(wall, 2), round(rss, 1))
    match = MEDIAN_MS.search(output)
    if match is None or code not in (0, 1):
        result.error = f"exit {code}; no 'median X ms' in the output"
        result.figures.append(Figure("median", None, "ms", target_ms, False))
        return result
    median = float(match.group(1))
    result.figures.append(Figure("median", median, "ms", target_ms, median <= target_ms))
    return result


def median_of(runs: list[Result]) -> Result:
    """One benchmark run several times: the median of its median, the largest peak RSS,
    the summed wall time; each run's figure in ``details``."""
    first = runs[0]
    values = [r.figures[0].value for r in runs]
    result = Result(
        first.name,
        first.script,
        first.what + f"; median of {len(runs)} processes",
        max(r.exit_code for r in runs),
        round(sum(r.wall_s for r in runs), 2),
        max(r.peak_rss_mib for r in runs),
        details={"runs_ms": values},
        error=next((r.error for r in runs if r.error), None),
    )
    measured = [v for v in values if v is not None]
    median = round(statistics.median(measured), 1) if len(measured) == len(values) else None
    target = first.figures[0].target
    result.figures.append(
        Figure("median", median, "ms", target, median is not None and median <= target)
    )
    return result


def philly_bench(shared: Path, limit_days: int | None, hosts: int | None = None) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "philly.json"
        argv = [sys.executable, str(BENCH / "bench_philly.py"), "--shared", str(shared)]
        argv += ["--json", str(out)]
        if limit_days is not None:
            argv += ["--limit-days", str(limit_days)]
        if hosts is not None:
            argv += ["--hosts", str(hosts)]
        code, _, wall, rss = run_child(argv)
        details = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    scope = details.get("scope", "full trace" if limit_days is None else f"{limit_days} days")
    name, target = ("philly", 30.0) if hosts is None else (f"philly_{hosts}_hosts", 60.0)
    what = f"Philly, {scope}: {hosts or 352} x 8 GPUs pooled, fairshare + preemption"
    result = Result(name, "bench_philly.py", what, code, round(wall, 2), round(rss, 1))
    result.details = details
    if not details or code not in (0, 1):
        result.error = f"exit {code}; no figures written"
        result.figures += [
            Figure("wall time", None, "s", target, False),
            Figure("peak RSS", None, "MiB", 1024.0, False),
        ]
        return result
    result.figures += [
        Figure("wall time", details["wall_s"], "s", details["target_wall_s"], details["wall_pass"]),
        Figure(
            "peak RSS",
            details["peak_rss_mib"],
            "MiB",
            details["target_rss_mib"],
            details["rss_pass"],
        ),
    ]
    return result


# --- machine and output -----------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def machine(reference_ms: list[float]) -> dict[str, Any]:
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "nproc": nproc,
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted_changes": None if dirty is None else bool(dirty),
        "reference_loop_ms": reference_ms,
        "core": compiled_core.STATE,
    }


def verdict(passed: bool | None, measured: bool = True) -> str:
    if not measured:
        return "ERROR"
    return "n/a" if passed is None else "PASS" if passed else "FAIL"


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} {unit}" if value < 10 else f"{value:.1f} {unit}"


def rows(results: list[Result]) -> list[tuple[str, str, str, str, str, str]]:
    out = []
    for r in results:
        for f in r.figures:
            out.append(
                (
                    r.name,
                    f.metric,
                    fmt(f.value, f.unit),
                    f"<= {f.target:g} {f.unit}",
                    f"{r.peak_rss_mib:.0f} MiB",
                    verdict(f.passed, f.value is not None),
                )
            )
    return out


HEADER = ("benchmark", "figure", "value", "target", "process peak RSS", "result")


def table(results: list[Result]) -> str:
    body = rows(results)
    widths = [max(len(str(row[i])) for row in (HEADER, *body)) for i in range(len(HEADER))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (HEADER, tuple("-" * w for w in widths), *body)
    ]
    return "\n".join(lines)


def markdown(
    results: list[Result], info: dict[str, Any], passed: bool, limit_days: int | None
) -> str:
    overall = "PASS" if passed else "FAIL"
    if limit_days is not None:
        overall += (
            f" (quick run: Philly limited to the first {limit_days} days, its targets not"
            " judged; run `make bench` for the real figures)"
        )
    lines = [
        "# Benchmarks: latest run",
        "",
        "Written by `make bench` (`bench/run_all.py`); each benchmark ran in its own process.",
        "",
        f"- date: {info['date']}",
        f"- machine: {info['nproc']} CPUs (nproc), {info['cpu']}, {info['platform']}",
        f"- Python: {info['implementation']} {info['python']}; scheduling core: {info['core']} "
        "(`compiled`: mypyc, `make core`; `pure`: the source, `ALLOT_PURE_CORE=1`)",
        "- speed: a 1M-iteration Python loop took "
        f"{info['reference_loop_ms'][0]} ms before the run, {info['reference_loop_ms'][1]} ms "
        "after (this shared VM drifts: 20 to 93 ms on 2026-12-02 alone; the timings scale with it)",
        f"- commit: {info['commit'] or 'unknown'}"
        + (" (with uncommitted changes)" if info["uncommitted_changes"] else ""),
        f"- overall: {overall}",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    lines.append("")
    for r in results:
        lines.append(f"- **{r.name}** (`bench/{r.script}`): {r.what}; process wall {r.wall_s} s.")
        if "runs_ms" in r.details:
            runs = ", ".join(f"{v} ms" for v in r.details["runs_ms"])
            lines.append(f"  Each process's median: {runs}.")
        if "pair_ratios" in r.details:
            pairs = ", ".join(f"{v}x" for v in r.details["pair_ratios"])
            lines.append(
                f"  10x / 1x of each back-to-back pair: {pairs} (the figure: their median)."
            )
        if r.error:
            lines.append(f"  ERROR: {r.error}")
    for philly in (r.details for r in results if r.name.startswith("philly") and r.details):
        lines += [
            "",
            "Philly settings and outcome: policy "
            f"`{philly['policy']}`, preemption {'on' if philly['preemption'] else 'off'}, "
            f"grace {philly['grace_s']} s; trace rows carry no min_runtime or resumable, so "
            f"the `allot simulate` defaults apply to every job: min_runtime "
            f"{philly['min_runtime_default_s'] / 3600:g}h, resumable "
            f"{'yes' if philly['resumable_default'] else 'no'}. {philly['jobs']:,} jobs "
            f"({philly['scope']}); load {philly['load_s']} s, simulate {philly['simulate_s']} s, "
            f"report {philly['report_s']} s. Simulated {philly['simulated_span_days']} days: "
            f"{philly['completed']:,} completed, {philly['preemptions']:,} preemptions, "
            f"{philly['requeues']:,} requeues, occupancy {philly['occupancy']:.1%}, "
            f"owed->delivered {philly['owed_delivered']} ({philly['hosts']} hosts).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path("../shared"), help="shared folder")
    parser.add_argument("--limit-days", type=int, help="Philly: first N days only (quick run)")
    args = parser.parse_args(argv)
    if args.limit_days is not None and args.limit_days <= 0:
        parser.error("--limit-days must be > 0")
    # As given (absolute, or relative to the working directory), else relative to the repo.
    shared = (args.shared if args.shared.exists() else REPO / args.shared).resolve()

    reference_before = machine_reference_s()
    results: list[Result] = []
    # The 1x and 10x cycles in back-to-back pairs of processes: the ratio is the median of
    # the pairs' ratios, so a drift of the machine between two runs does not decide it.
    one_x_runs: list[Result] = []
    ten_x_runs: list[Result] = []
    for pair in range(1, CYCLE_PAIRS + 1):
        print(f"== bench_cycle.py (pair {pair} of {CYCLE_PAIRS})", flush=True)
        one_x_runs.append(
            median_bench(
                "run_cycle",
                "bench_cycle.py",
                "one cycle, 1,000 hosts x 8 GPUs, 60% busy, 10,000 pending",
                50.0,
            )
        )
        print(f"== bench_cycle.py --hosts 10000 --pending 100000 (pair {pair})", flush=True)
        ten_x_runs.append(
            median_bench(
                "run_cycle_10x",
                "bench_cycle.py",
                "one cycle, the mixed layout scaled 10x: 10,000 hosts x 8 GPUs, 100,000 "
                "pending, 1,000 allocations",
                250.0,
                ("--hosts", "10000", "--pending", "100000", "--repeat", "20"),
            )
        )
    results.append(median_of(one_x_runs))
    print("== bench_cycle.py --layout full", flush=True)
    results.append(
        median_bench(
            "run_cycle_full",
            "bench_cycle.py",
            "one cycle, bench-live's full cluster: 10,000 pending that cannot fit, "
            "50 owed 1-GPU requests behind protected work",
            50.0,
            ("--layout", "full"),
        )
    )
    scaled = median_of(ten_x_runs)
    ratios = [
        t.figures[0].value / o.figures[0].value
        for o, t in zip(one_x_runs, ten_x_runs, strict=True)
        if o.figures[0].value and t.figures[0].value
    ]
    ratio = round(statistics.median(ratios), 1) if len(ratios) == CYCLE_PAIRS else None
    scaled.details["pair_ratios"] = [round(r, 2) for r in ratios]
    scaled.figures.append(Figure("10x / 1x", ratio, "x", 12.0, ratio is not None and ratio <= 12))
    results.append(scaled)
    print("== bench_hosts.py", flush=True)
    results.append(
        median_bench(
            "host_records",
            "bench_hosts.py",
            "the HOSTS log folded: 10,000 hosts x 8 GPUs joining in random order, "
            "1,000 drained, 500 healthy again",
            1000.0,
        )
    )
    print("== bench_fairshare.py", flush=True)
    results.append(
        median_bench("fairshare", "bench_fairshare.py", "Fair Tree rank, 1,000 allocations", 5.0)
    )
    print("== bench_reasons.py", flush=True)
    results.append(
        median_bench(
            "queue_reasons",
            "bench_reasons.py",
            "uncached `allot queue` answer (dry run_cycle + queue_order + explain_pending), "
            "1,000 hosts x 8 GPUs, 90% busy, 10,000 pending; details in reasons.md",
            200.0,
        )
    )
    print("== bench_philly.py", flush=True)
    results.append(philly_bench(shared, args.limit_days))
    print("== bench_philly.py --hosts 80", flush=True)
    results.append(philly_bench(shared, args.limit_days, hosts=80))

    errored = any(r.error for r in results)
    passed = not errored and all(f.passed is not False for r in results for f in r.figures)
    info = machine([round(reference_before * 1000, 1), round(machine_reference_s() * 1000, 1)])
    RESULTS.mkdir(parents=True, exist_ok=True)
    document = {
        "machine": info,
        "pass": passed,
        "philly_limit_days": args.limit_days,
        "benchmarks": [asdict(r) for r in results],
    }
    (RESULTS / "latest.json").write_text(
        json.dumps(document, indent=2) + "\n", encoding="utf-8", newline="\n"
    )
    (RESULTS / "latest.md").write_text(
        markdown(results, info, passed, args.limit_days), encoding="utf-8", newline="\n"
    )
    print()
    print(table(results))
    print(f"\n{'PASS' if passed else 'FAIL'}: wrote {RESULTS / 'latest.md'} and latest.json")
    if errored:
        return 2
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
