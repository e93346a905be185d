"""``bench/stream_probe.py`` (``bench_live.py --side-probe``): it times its three round
trips against a real nats-server, leaves no stream of its own behind, and writes to
WORKLOADS only records every log reader refuses (so the stack it probes folds nothing new).
"""

from __future__ import annotations

from collections.abc import Iterator

import nats
import pytest
from bench_scripts import load as load_bench
from nats.js.errors import NotFoundError

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.core.errors import ValidationError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(store_dir=tmp_path_factory.mktemp("stream-probe"), sync_always=True) as s:
        yield s


async def test_the_side_probe_times_each_round_trip_and_cleans_up(server: EmbeddedNats) -> None:
    probe = load_bench("stream_probe")
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    try:
        await bus.ensure_streams(js)
        before = (await js.stream_info("WORKLOADS")).state.messages
        times = await probe.probe(server.url, 0.3, 0.01)
        assert set(times) == {"own stream", "core request", "WORKLOADS"}
        rounds = len(times["WORKLOADS"])
        assert rounds >= 2
        for name, seconds in times.items():
            assert len(seconds) == rounds, name
            assert all(0 < t < 10 for t in seconds), name
        with pytest.raises(NotFoundError):
            await js.stream_info(probe.PROBE_STREAM)
        assert (await js.stream_info("WORKLOADS")).state.messages == before + rounds
        last = await js.get_last_msg("WORKLOADS", probe.workloads_subject(rounds))
        with pytest.raises(ValidationError):  # a reader skips it: no fold changes
            bus.decode_record(last.subject, last.data or b"")
    finally:
        await nc.close()


def test_percentiles_are_read_from_the_sorted_samples() -> None:
    probe = load_bench("stream_probe")
    line = probe._percentiles([0.004, 0.001, 0.003, 0.002])
    assert line == "n 4, p50 3.00 ms, p90 4.00 ms, p99 4.00 ms"
    assert probe._percentiles([]) == "no samples"
