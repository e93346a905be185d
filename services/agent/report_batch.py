"""Many hosts' reports in one request: a fake agent's ``PartReports``.

An agent reports each primary part's start and end (``PartReport``) as a request on its
host's ``allot.v1.host.<host>.report``. A fake agent simulating a whole cluster in one
process sends 2 of them per run: at 500 runs a second, 1,000 requests, each four messages
through nats-server (request, delivery, reply, delivery) and a future, a timer and a
socket write in the agent, on the same cores as the services (``make bench-live``). A
``ReportBatcher`` gathers the reports sent within ``linger_s`` into one ``PartReports`` on
``allot.v1.hosts.report``; dispatch judges each item as if it came alone and answers each
in order (``PartReportsAnswered``). The subject names no host, so only users granted every
subject (services) may send it: an agent under its own NATS user keeps per-host requests.

``send`` returns the item's own answer, or raises what a single request would have raised
(a timeout, a lost connection) for every item of a batch that got no answer; the caller
retries as before: items already stored are answered from the log, and their msg ids
dedupe the rest.
"""

from __future__ import annotations

import asyncio

import msgspec
from nats.aio.client import Client as NatsClient

from allot.bus.tasks import stop_tasks
from allot.proto import codec, subjects
from allot.proto import messages as m

LINGER_S = 0.05
"""How long the first report of a batch waits for others. Reports are off the decision
path (a run's start and end reach the log later by this much; dispatch lingers 250 ms more
before committing them); at 1,000 reports a second a batch holds about 50."""
MAX_BODY = 48 * 1024
"""A batch's body stays under this, below ``codec.MAX_PAYLOAD`` (64 KiB) with room for the
envelope: a report's ``detail`` may hold 1,024 characters."""

Answer = m.CommandAccepted | m.CommandRejected
_ANSWER = msgspec.json.Decoder(m.PartReportsAnswered | m.CommandRejected)
_HEAD = b'{"type":"PartReports","reports":['
_TAIL = b"]}"


class ReportBatcher:
    """See the module docstring. ``start`` it on the running loop; ``stop`` cancels the
    reports still waiting (their senders see ``asyncio.CancelledError``)."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        timeout_s: float,
        linger_s: float = LINGER_S,
        max_items: int = m.MAX_REPORTS,
        max_body: int = MAX_BODY,
    ) -> None:
        self._nc = nc
        self._timeout_s = timeout_s
        self._linger_s = linger_s
        self._max_items = max_items
        self._max_body = max_body
        self._queue: list[tuple[bytes, asyncio.Future[Answer]]] = []
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Batches sent so far (tests read it)."""

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await stop_tasks([self._loop_task, *self._sending])
        self._loop_task = None
        for _, fut in self._queue:
            fut.cancel()
        self._queue.clear()

    async def send(self, report: m.PartReport) -> Answer:
        """``report``'s answer, once its batch is answered (see the module docstring)."""
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._queue.append((codec.encode(report), fut))
        self._wake.set()
        return await fut

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self._linger_s)
            self._wake.clear()
            while self._queue:
                batch = self._take()
                task = asyncio.create_task(self._send(batch))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    def _take(self) -> list[tuple[bytes, asyncio.Future[Answer]]]:
        """The oldest reports that fit one body (at least one: a report alone always fits)."""
        size, n = len(_HEAD) + len(_TAIL), 0
        for body, _ in self._queue[: self._max_items]:
            if n and size + len(body) + 1 > self._max_body:
                break
            size, n = size + len(body) + 1, n + 1
        batch, self._queue = self._queue[:n], self._queue[n:]
        return batch

    async def _send(self, batch: list[tuple[bytes, asyncio.Future[Answer]]]) -> None:
        body = _HEAD + b",".join(item for item, _ in batch) + _TAIL
        self.batches += 1
        try:
            reply = await self._nc.request(subjects.HOSTS_REPORT, body, self._timeout_s)
            answer = _ANSWER.decode(reply.data)
            if isinstance(answer, m.PartReportsAnswered) and len(answer.answers) != len(batch):
                raise msgspec.ValidationError(
                    f"{len(answer.answers)} answers to a batch of {len(batch)} reports"
                )
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as e:  # each sender sees what its own request would have raised
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        answers = (
            answer.answers
            if isinstance(answer, m.PartReportsAnswered)
            else (answer,) * len(batch)  # the whole body refused: so is each report
        )
        for (_, fut), one in zip(batch, answers, strict=True):
            if not fut.done():
                fut.set_result(one)


__all__ = ["LINGER_S", "MAX_BODY", "ReportBatcher"]
