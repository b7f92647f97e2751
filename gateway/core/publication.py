"""What the protocol core and the store exchange: a publication as the router records it
for retention and history, who may see it, and a request for a page of history.

Plain data: the core creates publications, keeps the retained ones and asks for history
pages; the store writes them, reads them back and raises the read errors below.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from cairn.formats.publication_ids import PublicationIds

Slot = tuple[str, str, str]  # a retained slot: realm, topic, audience key


def audience_allows(audience: dict[str, list[Any]] | None, authid: str | None,
                    authrole: str | None) -> bool:
    """Would a session with this authid/authrole have received a publication with these
    authid/authrole black/white lists?"""
    if not audience:
        return True
    if authid in audience.get("exclude_authid", ()) or \
            authrole in audience.get("exclude_authrole", ()):
        return False
    if "eligible_authid" in audience and authid not in audience["eligible_authid"]:
        return False
    return not ("eligible_authrole" in audience and authrole not in audience["eligible_authrole"])


@dataclass(eq=False)
class StoredPublication:
    """One publication as the store keeps it (history row and/or retained slot)."""

    seq: int
    publication: int
    realm: str
    topic: str
    args: list[Any] | None
    kwargs: dict[str, Any] | None
    wall_ms: int
    boot_id: str
    boottime_ns: int
    clock_synced: bool
    authid: str | None = None
    authrole: str | None = None
    audience: dict[str, list[Any]] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    history_rule: int | None = None   # store in history under this rule
    retain: bool = False              # make it the topic's retained event
    packed: bytes | None = field(default=None, repr=False)  # its payload, once packed

    @property
    def audience_key(self) -> str:
        return json.dumps(self.audience, sort_keys=True) if self.audience else ""

    @property
    def slot(self) -> Slot:
        """Its retained slot: one per topic and audience."""
        return self.realm, self.topic, self.audience_key

    def payload(self) -> bytes:
        """msgpack [args, kwargs], packed once (for the queue's bound, retention's and the
        store's row)."""
        if self.packed is None:
            self.packed = msgpack.packb([self.args, self.kwargs], use_bin_type=True)
        return self.packed

    @property
    def size(self) -> int:
        return len(self.payload())

    @classmethod
    def from_row(cls, row: tuple[Any, ...], **extra: Any) -> StoredPublication:
        """From the columns of _STORED_ROW; ValueError (or TypeError) for a row that does
        not decode (:func:`decode_payload`, :func:`decode_object`)."""
        (seq, publication, realm, topic, wall_ms, boot_id, boottime_ns, synced, authid,
         authrole, audience, details, payload) = row
        args, kwargs = decode_payload(payload)
        return cls(seq, publication, realm, topic, args, kwargs, wall_ms, boot_id or "",
                   boottime_ns or 0, bool(synced), authid, authrole,
                   decode_object(audience) or None, decode_object(details), packed=payload,
                   **extra)


def decode_payload(payload: bytes) -> tuple[list[Any] | None, dict[str, Any] | None]:
    """A stored payload, msgpack [args, kwargs]; ValueError (or TypeError) when it is not."""
    args, kwargs = msgpack.unpackb(payload, raw=False)
    if not (args is None or isinstance(args, list)) or \
            not (kwargs is None or isinstance(kwargs, dict)):
        raise ValueError("the payload is not [args, kwargs]")
    return args, kwargs


def decode_object(text: str | None) -> dict[str, Any]:
    """A stored JSON object (details, audience), {} for none; ValueError when it is not."""
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"{text[:40]!r} is not a JSON object")
    return value


@dataclass(eq=False)
class Restored:
    """What the store kept, for the router to continue from: its receive order (the next
    seq, and the key of the publication ids that go with seqs), the kept subscriptions
    (id, realm, uri, match, created), the retained publications in receive order and the
    topics kept in history.
    Empty for a router that starts without its store: seqs from 1, random ids."""

    next_seq: int = 1
    ids: PublicationIds | None = None
    subscriptions: list[tuple[int, str, str, str, str]] = field(default_factory=list)
    retained: list[StoredPublication] = field(default_factory=list)
    history_topics: list[tuple[str, str]] = field(default_factory=list)  # (realm, topic)


@dataclass(frozen=True, eq=False)
class HistoryRead:
    """A page of a subscription's history: the stored publications of ``realm`` that the
    subscription (``uri``, ``match``) matches (only ``topic``, if given; of a pattern, only
    the topics ``visible`` admits), within ``times`` ((operator, wall ms)) and
    ``publications`` ((argument name, operator, publication id)), that ``caller``
    (authid, authrole) was eligible to receive; at most ``limit`` rows in receive order
    (newest first when ``reverse``). Past ``timeout`` s the read stops (ReadTimeout), and
    as soon as ``abandoned()`` (ReadAbandoned)."""

    realm: str
    uri: str
    match: str
    topic: str | None
    visible: Callable[[str], bool]
    times: tuple[tuple[str, int], ...]
    publications: tuple[tuple[str, str, int], ...]
    caller: tuple[str | None, str | None]
    reverse: bool
    limit: int
    timeout: float
    abandoned: Callable[[], bool]


class StorageError(Exception):
    """A write could not be made durable (disk full, read-only filesystem, I/O error)."""


class ReadTimeout(Exception):
    """A read ran past its deadline and was interrupted."""


class ReadAbandoned(Exception):
    """A read was interrupted because nobody waits for its answer any more."""


class UnknownPublication(LookupError):
    """A history read named a publication that is not in the stored history."""

    def __init__(self, argument: str, publication: int) -> None:
        super().__init__(argument, publication)
        self.argument, self.publication = argument, publication
