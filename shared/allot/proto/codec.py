"""Decode and encode wire messages; every decoding failure is one ``ValidationError``.

``decode(kind, data)`` is the edge where untrusted bytes enter: it returns a Struct or
raises ``allot.core.errors.ValidationError(field, reason)``, never anything else, whatever
the bytes are. ``field`` names what was wrong:

* a schema error at msgspec path ``$.assignment[0].gpus`` gives ``assignment[0].gpus``;
* an unknown field ``foo`` (at ``$``) gives ``foo``; a missing required field its name;
* a missing or wrong ``type`` tag gives ``type`` (``workloads[3].type`` in a batch's item),
  with the names expected there: every message carries its name, as ``proto/schema.json``
  requires (msgspec alone accepts a tagged Struct without its tag outside a union);
* malformed JSON and invalid UTF-8 give the last key opened before the error's byte offset
  when there is one (``{"gpus": NaN}`` gives ``gpus``), else ``body``;
* a payload over ``MAX_PAYLOAD`` bytes, truncated input and
  nesting too deep for the decoder (``RecursionError``, which is not a msgspec error) give
  ``body``.

Duplicate keys in one JSON object are rejected, naming the key: msgspec silently keeps the
last one, which would let a client smuggle a second value past a proxy that read the first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final, NamedTuple, TypeVar

import msgspec

from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.proto.subjects import IDENTITY_FORMS, Kind

T = TypeVar("T", bound=msgspec.Struct)

MAX_PAYLOAD: Final = 64 * 1024
"""Largest accepted command body in bytes (64 KiB; NATS itself allows 1 MiB)."""
MAX_RECORD_PAYLOAD: Final = 1024 * 1024
"""Largest accepted service-written record: a ranking or budget tree of a few thousand
nodes is far over 64 KiB (about 230 bytes per ranked node); NATS's own limit is 1 MiB."""
_LARGE_KINDS: Final = frozenset({Kind.RANKING, Kind.BUDGET_TREE})

BODY: Final = "body"
"""The field named when the whole payload is at fault."""

TYPES: Final[dict[Kind, Any]] = {
    Kind.SUBMIT: m.SubmitWorkload | m.SubmitBatch,
    Kind.CANCEL: m.CancelWorkload,
    Kind.OPERATOR_CANCEL: m.CancelWorkload,
    Kind.MANAGER_CANCEL: m.CancelWorkload,
    Kind.BUDGET_SET: m.SetBudget,
    Kind.HEARTBEAT: m.Heartbeat,
    Kind.HEALTH: m.HealthReport,
    Kind.HOST_REPORT: m.PartReport,
    Kind.HOST_SYNC: m.HostSync,
    Kind.HOST_UTIL: m.HostUtilization,
    Kind.HOSTS_REPORT: m.PartReports,
    Kind.HOST_WORK: m.HostWork,
    Kind.DRAIN: m.DrainHost,
    Kind.UNDRAIN: m.UndrainHost,
    Kind.HOST_STATE: m.HostEvent,
    Kind.EVENTS: m.WorkloadEvent,
    Kind.PREEMPT: m.PreemptionNotice,
    Kind.QUEUED: m.WorkloadQueued,
    Kind.RANKING: m.RankingUpdated,
    Kind.LEADER: m.LeaderElected,
    Kind.BUDGET_TREE: m.BudgetTreeSet,
    Kind.USAGE_GPU: m.HostUtilizationRecorded,
    Kind.IDLE: m.IdleEvent,
    Kind.WATCH: m.WatchLog,
    Kind.WATCHED: m.WorkloadEvent | m.PreemptionNotice,
}
"""What each subject kind carries: one Struct, or a union told apart by ``type``."""
# An identity form (the sender's login in the subject) carries what its bare form does.
TYPES.update({ident: TYPES[bare] for ident, bare in IDENTITY_FORMS.items()})


class _Typed(msgspec.Struct):
    """What the tag check reads of an object: only that it has a ``type`` (its value is
    the message decoder's to check); every other key is skipped unread."""

    type: Any


class _Reader(NamedTuple):
    """How to decode one Struct or union, and check that every message in it is tagged."""

    decoder: msgspec.json.Decoder[Any]
    types: tuple[str, ...]
    """The ``type`` values accepted at the top."""
    items: dict[str, str]
    """Fields holding messages (a batch's items) -> the items' ``type``."""
    tags: msgspec.json.Decoder[Any]
    """Fails, naming ``type`` where it is missing, at the top or in an item."""


def _reader(t: Any) -> _Reader:
    """msgspec requires ``type`` only where it tells a union apart: ``tags`` requires it of
    the top object and of each item of a field holding messages (items hold none)."""
    classes = getattr(t, "__args__", None) or (t,)
    types = tuple(str(c.__struct_config__.tag) for c in classes)
    assert "None" not in types, f"{t} is not a message"
    items: dict[str, str] = {}
    for c in classes:
        info = msgspec.inspect.type_info(c)
        assert isinstance(info, msgspec.inspect.StructType)
        for f in info.fields:
            inner = f.type.type if isinstance(f.type, msgspec.inspect.Metadata) else f.type
            item = getattr(inner, "item_type", None)
            if isinstance(item, msgspec.inspect.StructType) and item.tag is not None:
                items[f.name] = str(item.tag)
    view = msgspec.defstruct(
        "_TypedView", [("type", Any), *((n, tuple[_Typed, ...], ()) for n in items)]
    )
    return _Reader(msgspec.json.Decoder(t), types, items, msgspec.json.Decoder(view))


_READERS: Final[dict[Kind, _Reader]] = {kind: _reader(t) for kind, t in TYPES.items()}
_ENCODER: Final = msgspec.json.Encoder()

_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_AT_KEY = re.compile(r" - at `key` in `\$(?P<path>[^`]*)`$")
"""A mapping's key at fault (``env``'s names): the field is the mapping's."""
_NAMED = re.compile(r"(?:unknown|missing required) field `(?P<name>[\s\S]+)`$")
_BYTE = re.compile(r"\(byte (?P<pos>\d+)\)")
PATTERN_WORDS: Final = {
    m.NAME_PATTERN: "Expected a name of letters, digits, '_' and '-' only (a NATS subject token)",
    m.ENV_NAME_PATTERN: "Expected a variable name of letters, digits and '_', not starting "
    "with a digit",
    m.ENV_VALUE_PATTERN: "Expected a value without NUL",
    m.CHECKPOINT_DIR_PATTERN: "Expected an absolute path (starting with '/') without NUL",
}
"""msgspec quotes a pattern; a user reads what it allows instead."""
_PLAIN_KEY = re.compile(rb'"([^"]*)"\s*:')  # a key token when the body has no backslash
_KEY = re.compile(rb'"((?:[^"\\]|\\.){1,200})"\s*:')


def decode(kind: Kind | str, data: bytes, *, own: bool = False) -> msgspec.Struct:
    """Decode ``data`` as the message(s) carried by ``kind`` (see ``TYPES``).

    ``own``: ``data`` was written by an Allot service (a log record, a host's work list):
    the same schema checks, without the scan for a key repeated in one object. Only
    services may publish those subjects (``allot auth gen``) and their encoder never repeats
    a key, while the scan is most of the cost of decoding a large message."""
    try:
        k = Kind(kind)
    except ValueError:
        raise ValidationError("subject", f"unknown message kind {kind!r}") from None
    # What a service wrote may be larger than a command (a submission's record adds its id
    # and time; a host's work list holds every part's command and environment).
    limit = MAX_RECORD_PAYLOAD if own or k in _LARGE_KINDS else MAX_PAYLOAD
    return _decode_with(_READERS[k], data, limit, unique_keys=not own)


_BY_TYPE: dict[type, _Reader] = {}


def decode_as(cls: type[T], data: bytes, *, own: bool = False) -> T:
    """Decode ``data`` as one given message type, with ``decode``'s errors and ``own``."""
    reader = _BY_TYPE.get(cls)
    if reader is None:
        reader = _BY_TYPE[cls] = _reader(cls)
    limit = MAX_RECORD_PAYLOAD if own else MAX_PAYLOAD
    msg = _decode_with(reader, data, limit, unique_keys=not own)
    assert isinstance(msg, cls)
    return msg


def _decode_with(
    reader: _Reader, data: bytes, limit: int, *, unique_keys: bool = True
) -> msgspec.Struct:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ValidationError(BODY, f"must be bytes, got {type(data).__name__}")
    if len(data) > limit:
        raise ValidationError(
            BODY,
            f"payload is {len(data)} bytes; at most {limit} ({limit // 1024} KiB) are accepted",
        )
    try:
        msg: msgspec.Struct = reader.decoder.decode(data)
        # msgspec writes the tag first: what a service or the SDK encoded needs no second
        # pass, unless it holds items.
        if reader.items or bytes(data[:8]) != b'{"type":':
            reader.tags.decode(data)
    except msgspec.ValidationError as e:
        raise _about_type(reader, _schema_error(str(e))) from None
    except msgspec.DecodeError as e:
        if not bytes(data).strip():  # msgspec says "truncated": say what was expected
            expected = " or ".join(repr(t) for t in reader.types)
            raise ValidationError(
                BODY, f"is empty: expected a JSON object of type {expected}"
            ) from None
        if "UTF-8" in str(e):  # msgspec 0.23 reports no offset for it: find it ourselves
            raise _bad_utf8(bytes(data)) from None
        raise _syntax_error(str(e), bytes(data)) from None
    except RecursionError:
        raise ValidationError(BODY, "JSON is nested too deeply") from None
    except UnicodeDecodeError:
        raise _bad_utf8(bytes(data)) from None
    if unique_keys:
        _reject_duplicate_keys(bytes(data))
    return msg


def _about_type(reader: _Reader, e: ValidationError) -> ValidationError:
    """A missing or wrong ``type`` says what the place takes."""
    holder = e.field.split("[", 1)[0]
    if e.field == "type":
        names = reader.types
    elif e.field.endswith("].type") and holder in reader.items:
        names = (reader.items[holder],)
    else:
        return e
    return ValidationError(
        e.field, f"{e.reason} (the message's name: {' or '.join(map(repr, names))})"
    )


def item_field(field: str) -> str:
    """The field inside one item of a batch: ``workloads[3].gpus`` -> ``gpus`` (a field
    named outside any item is returned as it is)."""
    return field.split("].", 1)[-1]


def encode(msg: msgspec.Struct) -> bytes:
    """The JSON bytes of ``msg`` (with its ``type`` tag)."""
    return _ENCODER.encode(msg)


NATS_MAX_PAYLOAD: Final = 1024 * 1024
"""NATS's default message size limit."""


def answer_limit(server_max_payload: int) -> int:
    """What one answer may hold: the server's message size limit (its INFO), NATS's
    default before the server said (0)."""
    return server_max_payload if server_max_payload > 0 else NATS_MAX_PAYLOAD


def encode_within(build: Callable[[int], msgspec.Struct], n: int, limit: int) -> bytes:
    """``build(k)`` encoded for the largest ``k <= n`` tried whose encoding fits in ``limit``
    bytes: a listing answer carries its first rows and its ``total``, never more than one
    NATS message holds (rows with long reasons are ~600 bytes: 2,000 of them do not fit
    in 1 MiB). Shrinks ``k`` in proportion to the overshoot, with a 10% margin."""
    k = n
    while True:
        data = _ENCODER.encode(build(k))
        if len(data) <= limit or k == 0:
            return data
        k = min(k - 1, int(k * limit / len(data) * 0.9))


def _schema_error(text: str) -> ValidationError:
    path = ""
    at = _AT_KEY.search(text) or _AT.search(text)
    if at is not None:
        path = at.group("path")
        text = text[: at.start()] + (" (one of its names)" if at.re is _AT_KEY else "")
    for pattern, words in PATTERN_WORDS.items():
        text = text.replace(f"Expected `str` matching regex {pattern!r}", words)
    named = _NAMED.search(text)
    if named is not None:
        path = f"{path}.{named.group('name')}"
    field = path.removeprefix(".") or BODY
    return ValidationError(field, text)


def _syntax_error(text: str, data: bytes) -> ValidationError:
    if "trailing characters" in text:  # a complete document followed by garbage
        return ValidationError(BODY, text)
    at = _BYTE.search(text)
    return _near(text, data, None if at is None else int(at.group("pos")))


def _bad_utf8(data: bytes) -> ValidationError:
    try:  # msgspec's offset is within the string; find the offset within the payload
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return _near(f"invalid UTF-8 ({e.reason}) at byte {e.start}", data, e.start)
    return ValidationError(BODY, "invalid UTF-8")


def _near(text: str, data: bytes, pos: int | None) -> ValidationError:
    """Name the last key opened before byte ``pos`` (a best guess), else ``body``."""
    if pos is not None:
        keys = _KEY.findall(data[:pos])
        if keys:
            return ValidationError(keys[-1].decode("utf-8", "replace"), text)
    return ValidationError(BODY, text)


def _reject_duplicate_keys(data: bytes) -> None:
    """Already decoded, so ``data`` is valid JSON within the decoder's nesting limit.

    Fast path: without a backslash no string can hide a quote or spell a key another way,
    so every key is a ``"...":`` token; if no token repeats, no object has a key twice.
    Otherwise (a repeated token may be the same key in two objects) parse it all."""
    if b"\\" not in data:
        keys = _PLAIN_KEY.findall(data)
        if len(keys) == len(set(keys)):
            return

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValidationError(key, "appears more than once in the same object")
            seen.add(key)
        return dict(pairs)

    try:
        json.loads(data, object_pairs_hook=hook)
    except RecursionError:
        raise ValidationError(BODY, "JSON is nested too deeply") from None
