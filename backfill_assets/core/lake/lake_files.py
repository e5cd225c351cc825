"""What a lake's files say, without reading their rows: a digest of a partition's file list
(the pin of a lake snapshot, the sensor's signal), a file's SHA-256 (a Parquet folder's pin),
the proof by bytes of files whose rows were proved before (:func:`proved_by_bytes`), whether
an Iceberg scan's data files are the rows as they stand (then DuckDB reads them itself), and a
Delta version as a PyArrow dataset (or why delta-rs cannot give one)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from backfill_assets.core.errors import SpecError
from backfill_assets.core.fingerprint.rows import Reading
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


class Proven(NamedTuple):
    """Files whose rows were fingerprinted: the digest of their names, sizes and SHA-256
    (:func:`digests`), and the readings of their rows."""

    files: str
    readings: Reading


def digests(files: Mapping[str, Sequence[str]], sha256: Callable[[Sequence[str]], dict[str, str]]) -> dict[str, str]:
    """Each partition's digest of its files' names, sizes and SHA-256 (label -> full paths;
    ``sha256`` hashes files, by path), in any order."""
    hashes = sha256([p for paths in files.values() for p in paths])
    return {label: files_digest([(Path(p).name, str(os.stat(p).st_size), hashes[p]) for p in paths])
            for label, paths in files.items()}


def proved_by_bytes(files: Mapping[str, Sequence[str]], known: Mapping[str, Proven],
                    sha256: Callable[[Sequence[str]], dict[str, str]]) -> tuple[dict[str, Reading], dict[str, str]]:
    """Of each partition's files (label -> full paths) that ``known`` has a proof for: the
    digest of those files now (:func:`digests`), and, where it is the proven digest, the proven
    readings.

    Files with the same names, sizes and SHA-256 as files whose rows were fingerprinted hold
    those rows: a Parquet file's bytes are its rows, so the readings carry over without a row
    read. A partition with one file more or fewer, or one file rewritten (even in place, even
    to the same size), has another digest, and its rows must be fingerprinted again."""
    now = digests({label: paths for label, paths in files.items() if label in known}, sha256)
    return {label: known[label].readings for label, d in now.items() if d == known[label].files}, now


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
