"""What a lake's files say, without reading their rows: a digest of a partition's file list
(the pin of a lake snapshot, the sensor's signal), a file's SHA-256 (a Parquet folder's pin),
whether an Iceberg scan's data files are the rows as they stand (then DuckDB reads them
itself), and a Delta version as a PyArrow dataset (or why delta-rs cannot give one)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from backfill_assets.core.errors import SpecError
from backfill_assets.core.lake.tables import local_path, same_type


def files_digest(files: Sequence[tuple[str, ...]]) -> str:
    return hashlib.sha256(json.dumps(sorted(files), separators=(",", ":")).encode("utf-8")).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_files(paths: Sequence[str]) -> dict[str, str]:
    """Each file's SHA-256, by path, read here through a small buffer."""
    return {p: sha256_file(Path(p)) for p in paths}


def task_files(task: Any) -> list[str]:
    """The files an Iceberg scan task reads: its data file and its delete files (a
    merge-on-read delete changes a partition's rows without changing its data files)."""
    return [task.file.file_path, *sorted(d.file_path for d in task.delete_files)]


def plain_iceberg_files(iceberg_schema: Any, schema: pa.Schema, tasks: list[Any]) -> list[str] | None:
    """The local paths of the scan tasks' data files, if DuckDB reading them by column name
    gives exactly the rows pyiceberg's scan would: no task has delete files, and every file
    holds every column of the table under its field id, name and Arrow type (no column added,
    renamed or promoted since the file was written). None otherwise."""
    if any(task.delete_files for task in tasks):
        return None
    ids = {f.name: str(f.field_id) for f in iceberg_schema.fields}
    paths = []
    for task in tasks:
        path = local_path(task.file.file_path)
        found = pq.read_schema(path)
        for field in schema:
            if field.name not in found.names:
                return None
            have = found.field(field.name)
            field_id = (have.metadata or {}).get(b"PARQUET:field_id")
            if (field_id is not None and field_id.decode() != ids[field.name]) or not same_type(have.type, field.type):
                return None
        paths.append(path)
    return paths


def delta_dataset(table: Any, name: str) -> Any:
    """A Delta version as a PyArrow dataset, or SpecError naming what delta-rs cannot read
    that way (deletion vectors, column mapping: reader features of tables that other engines
    wrote)."""
    from deltalake.exceptions import DeltaProtocolError
    try:
        return table.to_pyarrow_dataset()
    except DeltaProtocolError as err:
        raise SpecError(f"source {name} cannot be read as the engine reads Delta tables: "
                        f"{' '.join(str(err).split())[:300]}; rewrite it without that table feature") from None
