"""PostgreSQL's built-in logical decoding output (``pgoutput``, protocol version 1), read through the SQL functions
(``pg_logical_slot_peek_binary_changes``): each row is one message. Only what the observer needs — a transaction's
commit (its LSN and time) and the rows it inserted, updated or deleted, as text, with the row before where the
table's replica identity is FULL. The format: PostgreSQL's "Logical Replication Message Formats"."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # PostgreSQL's timestamps count microseconds from here


@dataclass
class Change:
    kind: str  # insert | update | delete
    table: str  # schema.table
    old: dict[str, str | None] | None  # the row before (UPDATE/DELETE under REPLICA IDENTITY FULL), as text
    new: dict[str, str | None] | None


@dataclass
class Transaction:
    lsn: str  # where the commit record ends: the slot is advanced to it once every change is judged
    committed_at: datetime
    changes: list[Change] = field(default_factory=list)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def text(self) -> str:
        end = self.data.index(b"\0", self.at)
        value = self.data[self.at : end].decode()
        self.at = end + 1
        return value

    def tuple(self) -> list[str | None]:
        values: list[str | None] = []
        for _ in range(self.take("!h")):
            kind = self.take("!c")
            if kind == b"t":
                length = self.take("!i")
                values.append(self.data[self.at : self.at + length].decode())
                self.at += length
            else:  # n: NULL; u: an unchanged TOASTed value (not sent)
                values.append(None)
        return values


def transactions(rows: list[tuple[str, bytes]]) -> list[Transaction]:
    """The complete transactions among ``(lsn, data)`` rows, in commit order. Relation messages are remembered
    (each change names its table by the relation's id)."""
    relations: dict[int, tuple[str, list[str]]] = {}
    done: list[Transaction] = []
    current: list[Change] = []
    for lsn, data in rows:
        reader = _Reader(bytes(data))
        kind = reader.take("!c")
        if kind == b"B":
            current = []
        elif kind == b"R":
            relid = reader.take("!I")
            schema, name = reader.text(), reader.text()
            reader.take("!b")  # replica identity setting
            columns = []
            for _ in range(reader.take("!h")):
                reader.take("!b")
                columns.append(reader.text())
                reader.take("!I")
                reader.take("!i")
            relations[relid] = (f"{schema}.{name}", columns)
        elif kind in (b"I", b"U", b"D"):
            current.append(_change(kind, reader, relations))
        elif kind == b"C":
            reader.take("!b")
            reader.take("!Q")  # the commit's LSN
            reader.take("!Q")  # its end
            micros = reader.take("!q")
            done.append(Transaction(lsn, _EPOCH + timedelta(microseconds=micros), current))
            current = []
        # O (origin), Y (type), T (truncate), M (message): nothing the observer judges
    return done


def _change(kind: bytes, reader: _Reader, relations: dict[int, tuple[str, list[str]]]) -> Change:
    table, columns = relations[reader.take("!I")]
    old = new = None
    marker = reader.take("!c")
    if kind == b"I":
        new = dict(zip(columns, reader.tuple(), strict=True))
    elif kind == b"D":
        old = dict(zip(columns, reader.tuple(), strict=True))
    else:
        if marker in (b"K", b"O"):  # the old row (O: every column, under REPLICA IDENTITY FULL)
            old = dict(zip(columns, reader.tuple(), strict=True))
            marker = reader.take("!c")
        new = dict(zip(columns, reader.tuple(), strict=True))
    return Change({b"I": "insert", b"U": "update", b"D": "delete"}[kind], table, old, new)
