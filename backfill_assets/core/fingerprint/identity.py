"""Identities: the plan id and the snapshot id, as SHA-256 over canonical JSON.

Kept apart from the data fingerprint (core.fingerprint.rows, the canonical encoding of rows): these
hash documents, the plan an approver approves and the snapshot it was built from. Both ids
are pinned by literal values in backfill_assets_tests/core/fingerprint/test_identity_pins.py; changing
what they cover is a format change (PLAN_FORMAT, SNAPSHOT_FORMAT).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NotRequired, TypedDict

from backfill_assets.core.fingerprint.rows import Digest

PLAN_FORMAT = "backfill-assets/plan/v1"
SNAPSHOT_FORMAT = "backfill-assets/snapshot/v3"  # v3: the format-3 row digest (core.fingerprint.rows)


class PartitionDigest(Digest):
    """One partition of a snapshot document, as the control store keeps it too."""

    partition: str


class SnapshotDocument(TypedDict):
    """What a snapshot's fingerprint hashes: the source, its columns and each partition's
    digest; a pinned source's version; with records that can move, the digest of the scope's
    keys' versions outside its partitions."""

    format: str
    source: str
    version: NotRequired[str]
    partition_key: str
    columns: list[list[str]]
    partitions: list[PartitionDigest]
    versions_outside: NotRequired[Digest]
    # The spec's other inputs as read in the same snapshot (core.store.plan_document.InputPin).
    inputs: NotRequired[list[dict[str, object]]]


class PinDocument(TypedDict):
    """A pinned source's version (core.pinned.pins.Pin): its name, and its files as
    [path, size, SHA-256] where they are pinned one by one."""

    version: str
    files: NotRequired[list[list[str | int]]]


class ScopeDocument(TypedDict):
    """What a snapshot id covers beside the data: the partitions requested, those moved
    records added (label -> reasons) and the moves found ([key, from, to]); a pinned source's pin."""

    requested: list[str]
    added: dict[str, list[str]]
    moves: list[list[str]]
    pin: NotRequired[PinDocument]


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes plan and snapshot ids are hashed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plan_id_of(document: dict[str, Any]) -> str:
    """The id of a plan: the SHA-256 of its document's canonical JSON."""
    return sha256_hex(canonical_json(document))


def snapshot_identity(document: SnapshotDocument, scope: ScopeDocument, mode: str) -> tuple[str, str]:
    """(snapshot id, fingerprint) of a snapshot document. The fingerprint covers the data and
    names the copy; the id also covers the scope (the requested partitions, and the moves
    found in the target)."""
    fingerprint = sha256_hex(canonical_json(document))
    scoped = sha256_hex(canonical_json({"fingerprint": fingerprint, "scope": scope}))
    return f"{mode}-{scoped[:16]}", fingerprint
