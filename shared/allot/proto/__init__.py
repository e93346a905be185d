"""The wire contract for any client: versioned NATS subjects, msgspec Structs, the codec.

* ``allot.proto.subjects``: subject builders and constants (``allot.v1....``) and
  ``validate_token``; the subject scheme and what each wildcard grant means.
* ``allot.proto.messages``: one frozen, tagged ``msgspec.Struct`` per command and event.
* ``allot.proto.codec``: ``decode(kind, data)`` and ``encode(msg)``; every decoding failure
  becomes one ``allot.core.errors.ValidationError`` naming the field.
* ``allot.proto.schema``: JSON Schema and AsyncAPI 3.0 generation (``python -m
  allot.proto.schema --write`` / ``--check``); the committed copies live in ``proto/``.

Depends on msgspec and ``allot.core.errors`` only (an import-linter contract).
"""

from __future__ import annotations
