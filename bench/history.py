"""A Jepsen-style history of client operations, for the fault-injection suite (issue 5).

Every submission is recorded twice: an ``invoke`` before the request goes out, then its
completion, with the same ``client_id``:

* ``ok``: intake answered ``WorkloadAccepted`` (the workload id rides in ``value``);
* ``fail``: the request certainly did not take effect: intake refused it
  (``SubmitRejectedError``), the body failed the local check (``ValidationError``), or
  nobody subscribed to the subject (``NoResponderError``: the server says nobody got any
  of the SDK's attempts; after an unanswered attempt the SDK never raises it);
* ``unknown``: anything else (timeout after the SDK's retries, a connection lost while
  waiting, a bad reply): the submission may or may not be in the log. The checker allows
  both for these, and only these.

The fault injector records its faults in the same history (``type="info"``,
``f="fault"``), so the checker can measure recovery from them without another input.

Times: ``time`` is ``time.monotonic()`` (orders operations and measures delays in this
process) and ``wall`` is ``time.time()`` (compared with the ``at`` of log records, which
services stamp with the wall clock). Both come from injectable clocks for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.sdk.client import Client
from allot.sdk.errors import NoResponderError

OpType = Literal["invoke", "ok", "fail", "unknown", "info"]
Value = dict[str, str | int | float | bool | None]

SUBMIT = "submit"
FAULT = "fault"


class Op(msgspec.Struct, frozen=True, kw_only=True):
    """One history entry. ``value`` of a submit holds ``client_id``, ``allocation``,
    ``gpus`` (and ``workload_id`` once ok); of a fault ``kind`` and ``target``."""

    process: str
    type: OpType
    f: str
    value: Value
    time: float
    wall: float
    error: str = ""


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Op)


class History:
    """An append-only list of ``Op``; ``submit`` wraps ``Client.submit``."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.ops: list[Op] = []
        self._clock = clock
        self._wall = wall_clock

    def record(self, process: str, type_: OpType, f: str, value: Value, error: str = "") -> Op:
        op = Op(
            process=process,
            type=type_,
            f=f,
            value=value,
            time=self._clock(),
            wall=self._wall(),
            error=error,
        )
        self.ops.append(op)
        return op

    def fault(self, kind: str, target: str, **detail: str | int | float | None) -> Op:
        """Record that a fault was injected now (call it right before the signal)."""
        return self.record("nemesis", "info", FAULT, {"kind": kind, "target": target, **detail})

    async def submit(
        self,
        client: Client,
        *,
        client_id: str,
        user: str,
        gpus: int,
        allocation: str | None = None,
        min_runtime_s: int = 0,
        duration_s: float | None = None,
        process: str = "client",
        timeout: float | None = None,
    ) -> m.WorkloadAccepted | None:
        """Submit through the SDK, recording invoke and completion. Never raises for a
        failed or uncertain submission (the load must go on); returns the reply when ok."""
        value: Value = {"client_id": client_id, "allocation": allocation, "gpus": gpus}
        self.record(process, "invoke", SUBMIT, value)
        try:
            reply = await client.submit(
                client_id=client_id,
                user=user,
                gpus=gpus,
                allocation=allocation,
                min_runtime_s=min_runtime_s,
                duration_s=duration_s,
                timeout=timeout,
            )
        except (ValidationError, NoResponderError) as e:
            # ValidationError covers SubmitRejectedError (intake said no) and the local
            # check (never sent); no responders: the server delivered it to nobody.
            self.record(process, "fail", SUBMIT, value, _describe(e))
            return None
        except Exception as e:  # timeouts, lost connections, bad replies: outcome unknown
            self.record(process, "unknown", SUBMIT, value, _describe(e))
            return None
        done: Value = {**value, "workload_id": reply.workload_id, "duplicate": reply.duplicate}
        self.record(process, "ok", SUBMIT, done)
        return reply

    # ------------------------------------------------------------------ JSON lines
    def dumps(self) -> bytes:
        return dumps(self.ops)

    def dump(self, path: Path) -> None:
        path.write_bytes(self.dumps())


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:500]


def dumps(ops: Iterable[Op]) -> bytes:
    """JSON lines, one op each."""
    return b"".join(_ENCODER.encode(op) + b"\n" for op in ops)


def loads(data: bytes) -> list[Op]:
    """Read JSON lines back; a bad line raises ``ValidationError`` naming its number."""
    out: list[Op] = []
    for n, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(_DECODER.decode(line))
        except msgspec.DecodeError as e:  # ValidationError is a DecodeError subclass
            raise ValidationError(f"history line {n}", str(e)) from None
    return out


def load(path: Path) -> list[Op]:
    return loads(path.read_bytes())


def completions(ops: Sequence[Op]) -> dict[str, tuple[Op, Op | None]]:
    """``client_id`` -> (invoke, completion or None) for submissions."""
    out: dict[str, tuple[Op, Op | None]] = {}
    for op in ops:
        if op.f != SUBMIT:
            continue
        cid = str(op.value.get("client_id"))
        if op.type == "invoke":
            out[cid] = (op, None)
        elif cid in out:
            out[cid] = (out[cid][0], op)
    return out
