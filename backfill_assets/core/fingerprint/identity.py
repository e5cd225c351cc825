"""Identities: the plan id and the snapshot id, as SHA-256 over canonical JSON.

Kept apart from the data fingerprint (core.fingerprint.rows, the canonical encoding of rows): these
hash documents, the plan an approver approves and the snapshot it was built from. Both ids
are pinned by literal values in backfill_assets_tests/core/fingerprint/test_identity_pins.py; changing
what they cover is a format change (PLAN_FORMAT, SNAPSHOT_FORMAT).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

PLAN_FORMAT = "backfill-assets/plan/v1"
SNAPSHOT_FORMAT = "backfill-assets/snapshot/v3"  # v3: the format-3 row digest (core.fingerprint.rows)


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes plan and snapshot ids are hashed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plan_id_of(document: dict[str, Any]) -> str:
    """The id of a plan: the SHA-256 of its document's canonical JSON."""
    return sha256_hex(canonical_json(document))


def snapshot_identity(document: dict[str, Any], scope: dict[str, Any], mode: str) -> tuple[str, str]:
    """(snapshot id, fingerprint) of a snapshot document. The fingerprint covers the data and
    names the copy; the id also covers the scope (the requested partitions, and the moves
    found in the target)."""
    fingerprint = sha256_hex(canonical_json(document))
    scoped = sha256_hex(canonical_json({"fingerprint": fingerprint, "scope": scope}))
    return f"{mode}-{scoped[:16]}", fingerprint
