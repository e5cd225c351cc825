"""Lake tables a backfill can replace partitions of, behind one small interface
(:class:`LakeTable`): Delta Lake (``deltalake``, core.lake.delta) and Apache Iceberg
(``pyiceberg``, core.lake.iceberg).

Each is written with its engine's native partition overwrite, in one commit per partition
(or group of partitions), or, by a build engine that writes the files itself (DuckDB), as those
files committed in one replacement of the partition (:class:`FileLakeTable`):

- Delta: ``write_deltalake(mode="overwrite", predicate=<the partition>)`` on a handle loaded
  at the version the partition was read at. delta-rs refuses rows outside the predicate, and
  fails the commit (``CommitFailedError``) when another writer changed the same partition
  since that version. The predicate is built here from typed, validated values only, and
  compared with the one the table's history records for our version.
- Iceberg: ``overwrite(df, overwrite_filter=<the partition>)`` on a table loaded at the
  snapshot the partition was read at: one catalog commit (a delete and an append snapshot),
  validated against writers since. pyiceberg does not refuse rows outside the filter (they
  would land in other partitions), so every row's partition is checked here first. Never
  ``dynamic_partition_overwrite``: with an empty stage it leaves the stale rows.

Both read a partition at an exact version (Delta) or snapshot (Iceberg), so the check after
our commit reads what we committed, whatever was committed since; both carry our plan id and
content hash in the commit's own metadata. The stages, the control schema and the ledger
stay in PostgreSQL (core.lake.target.LakeTarget ties the two together).

Both engines REBASE a commit over another writer's commit to other partitions (delta-rs's
conflict checker and pyiceberg's retries test only the overwrite's own partitions): right for
a partition overwrite, not for a promise about the whole table. With ``records_can_move`` a
business key has one home across the table, so :meth:`LakeTable.keys_elsewhere` reads, at
the version the commit is based on, whether a key being written lies in another partition,
and the overwrite is then ``exclusive``: committed as the very next version after that one,
or not at all (Delta ``max_commit_retries=0``: a newer version, or losing the race for the
next one, fails the commit; Iceberg: no retry, so ``AssertRefSnapshotId`` on the snapshot
read fails it). :meth:`LakeTable.follows` confirms afterwards that nothing landed in
between, without relying on either library keeping that behaviour.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from backfill_assets.core.errors import BackfillError, LakeTargetError, VerificationError
from backfill_assets.core.lake.parts import Part, arrow_filter, part_label
from backfill_assets.core.pg.db import as_transient
from backfill_assets.core.vocabulary import PartitionValue, partition_label
from backfill_assets.core.windows import Windowing

# Commit metadata keys (Delta commit properties, Iceberg snapshot summary).
META_PREFIX = "backfill_assets."


@dataclass(frozen=True)
class TableShape:
    """What a lake table's metadata says: its columns and Arrow types, its partitioning, and
    what could refuse rows at commit: columns that may not be NULL, and table constraints."""

    columns: list[tuple[str, pa.DataType]]
    partitioned_by: list[str]
    required: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)


class LakeTable(Protocol):
    """One lake table. ``Handle`` is the table loaded at one version (None: no table yet)."""

    name: str

    def shape(self) -> TableShape | None:
        """The table's columns and partitioning, or None when it does not exist."""
        ...

    def open(self) -> Any:
        """The table at its current version (None when it does not exist)."""
        ...

    def version(self, handle: Any) -> str | None:
        """The version (Delta) or snapshot id (Iceberg) a handle reads; None: no commit yet."""
        ...

    def read(self, handle: Any, column: str, values: Sequence[Part]) -> pa.Table:
        """The rows of some partitions as the handle's version holds them."""
        ...

    def read_version(self, version: str | None, column: str, values: Sequence[Part]) -> pa.Table:
        """The rows of some partitions at exactly ``version``, read afresh."""
        ...

    def read_columns(self, handle: Any, columns: Sequence[str]) -> pa.Table:
        """Some columns of every row, as the handle's version holds them."""
        ...

    def create(self, schema: pa.Schema, partition_key: str, windowing: Windowing | None = None) -> str | None:
        """Create the table, empty, partitioned by ``partition_key`` (identity; for time
        windows as the format holds them: Delta not partitioned, Iceberg by the transform that
        cuts time where they do); return the version that creation made (what :meth:`version` says of a handle opened right after,
        unless another writer came in between).

        Raises:
            TransientDatabaseError: another writer created the table first.
        """
        ...

    def close(self) -> None:
        """Release the catalog's connections."""
        ...

    def overwrite(self, handle: Any, column: str, values: Sequence[Part], data: pa.Table,
                  metadata: Mapping[str, str], exclusive: bool = False) -> str | None:
        """Replace the partitions with ``data`` in one commit based on the handle's version;
        return the committed version. The handle then reads that version. ``exclusive``: the
        commit must be the next version after the handle's (not rebased over a commit to
        other partitions).

        Raises:
            TransientDatabaseError: another writer changed these partitions since (with
                ``exclusive``: the table) (safe to retry).
        """
        ...

    def keys_elsewhere(self, handle: Any, column: str, values: Sequence[Part],
                       keys: pa.Table) -> pa.Table | None:
        """The rows, as the handle's version holds them, outside the partitions ``values``
        whose business key (the columns of ``keys``) is one of ``keys``' rows: their
        partition column and key columns only (None: no table or no commit yet). Reads only
        those columns, skipping the partitions ``values`` and the files whose key statistics
        lie outside the keys' range."""
        ...

    def follows(self, handle: Any, base: str | None, metadata: Mapping[str, str]) -> bool:
        """Whether the version the handle reads was committed directly on ``base`` by the
        commit carrying ``metadata`` (nothing of another writer in between)."""
        ...

    # The name of what partition_signatures reads (core.audit shows it).
    SIGNAL: str

    def versions_after(self, handle: Any, version: str) -> list[str] | None:
        """The versions (Delta) or snapshot ids (Iceberg) committed after ``version`` up to the
        handle's, oldest first; None where the table keeps no versions or ``version`` is no
        longer an ancestor of the handle's."""
        ...

    def partition_signatures(self, handle: Any, column: str, values: Sequence[Part],
                             version: str | None = None) -> dict[str, str | None] | None:
        """Label -> what each partition is made of, from metadata only (its data files, no row
        read), as the handle's version holds it or, with ``version``, at that version; equal
        only while its rows are. None where the table's files are not simply its rows (delete
        files, deletion vectors, column mapping, a table not partitioned by ``column``) or,
        with ``version``, where the table keeps no versions (a folder, a catalog table)."""
        ...


def signature(*parts: object) -> str:
    """A partition's signature: the SHA-256 of its metadata parts (JSON)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _library_errors() -> tuple[type[BaseException], ...]:
    """What deltalake, pyiceberg, pyarrow, SQLAlchemy (the Iceberg catalog) and the file system
    raise: the failures :func:`lake_errors` reports as our own."""
    import pyiceberg.exceptions as iceberg_errors
    from deltalake.exceptions import DeltaError
    from sqlalchemy.exc import SQLAlchemyError
    iceberg = tuple(v for v in vars(iceberg_errors).values() if isinstance(v, type) and issubclass(v, Exception))
    return (DeltaError, OSError, pa.ArrowException, ValueError, SQLAlchemyError, *iceberg)


@contextlib.contextmanager
def lake_errors(table: LakeTable, what: str) -> Iterator[None]:
    """Report a lake library's failure as :class:`LakeTargetError` (a one-line message, at most
    300 characters of the library's, the table's secret removed), so that apply records it in
    the ledger and stops like any other failure. Our own errors pass through."""
    try:
        yield
    except BackfillError:
        raise
    except _library_errors() as err:
        # A lock or statement timeout in an Iceberg catalog kept in PostgreSQL (SQLAlchemy wraps
        # the driver's error): transient, like the same wait anywhere else.
        transient = as_transient(err, f"{what} {table.name}")
        if transient is not None:
            raise transient from None
        text = " ".join(str(err).split())
        secret = getattr(table, "secret", None)
        if secret:
            text = text.replace(secret, "[redacted]")
        problem = f"{what} {table.name}: {err.__class__.__name__}: {text[:300]}"
    else:
        return
    raise LakeTargetError(problem)  # outside the except block: the library's error is not chained


def local_path(location: str) -> str:
    """An absolute local path from a path or file:// URI (relative paths: the current directory)."""
    return str(Path(location.removeprefix("file://")).expanduser().resolve())


_UTC_NAMES = ("UTC", "+00:00", "Etc/UTC", "Z")


def _folded(t: pa.DataType) -> pa.DataType | str | tuple:
    """An Arrow type with what does not change its values folded: dictionaries by their value
    type, the string kinds into one, the binary kinds into one, UTC by any name."""
    if pa.types.is_dictionary(t):
        return _folded(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return ("timestamp", t.unit, "UTC" if t.tz in _UTC_NAMES else t.tz)
    return t


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether two Arrow types hold the same values (:func:`_folded`)."""
    return _folded(a) == _folded(b)


def type_text(t: pa.DataType) -> str:
    """An Arrow type as plans and messages print it, folded as :func:`same_type` folds it."""
    folded = _folded(t)
    if isinstance(folded, str):
        return folded
    if isinstance(folded, tuple):
        return f"timestamp[{folded[1]}, tz={folded[2]}]" if folded[2] else f"timestamp[{folded[1]}]"
    return str(folded)


def shape_problems(name: str, shape: TableShape, wanted: Sequence[tuple[str, pa.DataType]],
                   partitioned_by: Sequence[str]) -> list[str]:
    """Why an existing lake table cannot take the stage's rows, naming each column
    (``partitioned_by``: how the rows must be partitioned, the partition key itself or, for
    time windows, what the format checked)."""
    problems = []
    have = dict(shape.columns)
    for column, want in wanted:
        if column not in have:
            problems.append(f"{name} has no column {column} (the stage has it as {type_text(want)})")
        elif not same_type(have[column], want):
            problems.append(
                f"{name} column {column} is {type_text(have[column])} but the stage's is {type_text(want)}"
            )
    extra = [c for c, _ in shape.columns if c not in dict(wanted)]
    if extra:
        problems.append(f"{name} has column(s) {', '.join(extra)} that the spec's columns do not list")
    for column in shape.required:
        problems.append(
            f"{name} column {column} may not be NULL, but the stage's column may hold NULL (and the rows "
            "written declare it nullable); make the lake column nullable"
        )
    for constraint in shape.constraints:
        problems.append(
            f"{name} has the constraint {constraint}, which could refuse the stage's rows at commit; "
            "drop it, or keep it out of the table this tool writes"
        )
    if list(shape.partitioned_by) != list(partitioned_by):
        problems.append(
            f"{name} is partitioned by ({', '.join(shape.partitioned_by) or 'nothing'}), "
            f"not by ({', '.join(partitioned_by)}) as the spec writes it"
        )
    return problems


EXAMPLE_KEYS = 3  # example keys an error names


def key_bounds(keys: pa.Table) -> list[tuple[str, Any, Any]]:
    """Each key column's least and greatest value among ``keys`` (NULLs left out), for the
    column types whose order file statistics keep as Python compares them (integers, text,
    dates): a range the key check filters on, so that the engine skips the files and row
    groups outside it. Only a pre-filter: :func:`_among` decides."""
    bounds = []
    for name in keys.column_names:
        t = keys.schema.field(name).type
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_date32(t)):
            continue
        extremes = pc.min_max(keys[name])
        least, greatest = extremes["min"].as_py(), extremes["max"].as_py()
        if least is not None and greatest is not None:
            bounds.append((name, least, greatest))
    return bounds


def among(found: pa.Table, keys: pa.Table) -> pa.Table:
    """The rows of ``found`` whose key (the columns of ``keys``) equals a row of ``keys``: a
    semi-join in Arrow, the keys cast to the lake's types (a NULL key matches nothing)."""
    names = keys.column_names
    plain = {n: found.schema.field(n).type for n in names}
    for n, t in plain.items():
        if pa.types.is_dictionary(t):
            found = found.set_column(found.schema.get_field_index(n), n, found[n].cast(t.value_type))
            plain[n] = t.value_type
    wanted = pa.table({n: keys[n].cast(plain[n]) for n in names})
    return found.join(wanted, keys=names, join_type="left semi")


@dataclass(frozen=True)
class KeysFound:
    """Business keys found in other partitions: those partitions (labels, sorted), how many
    distinct keys, and a few as ``key=value in partition``."""

    partitions: list[str]
    count: int
    examples: list[str]


def keys_found(found: pa.Table | None, column: str, key_columns: Sequence[str],
               name: Callable[[Any], str] = partition_label) -> KeysFound | None:
    """What :meth:`LakeTable.keys_elsewhere` found, for a message; None if nothing. ``name``
    names the partition of a column value (a window's label for windows)."""
    if found is None or found.num_rows == 0:
        return None
    labels = sorted({"NULL" if v is None else name(v) for v in pc.unique(found[column]).to_pylist()})
    count = found.group_by(list(key_columns)).aggregate([]).num_rows
    first = found.sort_by([(c, "ascending") for c in (*key_columns, column)]).slice(0, EXAMPLE_KEYS)
    examples = [
        ", ".join(f"{c}={row[c]}" for c in key_columns)
        + f" in {'NULL' if row[column] is None else name(row[column])}"
        for row in first.to_pylist()
    ]
    return KeysFound(labels, count, examples)


def check_rows_in(data: pa.Table, column: str, values: Sequence[Part], name: str) -> None:
    """Every row of ``data`` must lie in one of the partitions ``values`` (pyiceberg writes
    rows outside an overwrite's filter into other partitions instead of refusing them).

    Raises:
        VerificationError: naming how many rows lie outside.
    """
    if data.num_rows == 0:
        return
    inside = pads.dataset(data.select([column])).count_rows(filter=arrow_filter(column, values))
    outside = data.num_rows - inside
    if outside:
        labels = ", ".join(part_label(v) for v in values)
        raise VerificationError(labels, f"partition check before writing {name}",
                                f"every row in partition(s) {labels}", f"{outside} row(s) outside")


def commit_failed(name: str, values: Sequence[Part], base: object, exclusive: bool, why: str) -> str:
    """The problem of an overwrite another writer's commit made fail (TransientDatabaseError
    adds that it is safe to retry)."""
    labels = ", ".join(part_label(v) for v in values)
    if exclusive:
        return (f"replacing partition(s) {labels} of {name}: another writer committed to the table after "
                f"version {base}, which our commit had to follow directly (with records_can_move the "
                f"business keys are checked at that version) ({why}); nothing of ours was committed")
    return (f"replacing partition(s) {labels} of {name}: another writer committed to them first ({why}); "
            "nothing of ours was committed")


@dataclass(frozen=True)
class WrittenFile:
    """A data file a build engine wrote into a lake table's folder for one partition, not yet
    committed: its full local path, the path the table's metadata names it by (Delta: relative
    to the table's folder; Iceberg: a URI), its size and rows."""

    label: str
    path: str
    logged: str
    size: int
    rows: int


@runtime_checkable
class FileLakeTable(LakeTable, Protocol):
    """A lake table whose partitions a build engine can write as plain Parquet files and
    commit itself (Delta, Iceberg): the engine writes and fingerprints the files within its own
    memory limit, the table commits exactly those files in one replacement of the partitions,
    and a version's files of a partition can be read back by the engine. None of the rows pass
    through Python."""

    carries_partition: bool  # whether a data file holds the partition column (Iceberg) or the log does (Delta)

    def partition_files(self, handle: Any, column: str, values: Sequence[PartitionValue],
                        version: str | None = None) -> dict[str, list[str]] | None:
        """Per partition label, the full local paths of the data files holding its rows at the
        handle's version (or at ``version``). None: that version cannot be read as plain
        files (deletion vectors, delete files, columns renamed or retyped since a file was
        written...); read it through the library then."""
        ...

    def writable_as_files(self, handle: Any) -> bool:
        """Whether files an engine writes, committed as they are, are read by every reader of
        the table as the rows they hold (None: a table about to be created)."""
        ...

    def new_file(self, handle: Any, column: str, label: str, tag: str) -> tuple[str, str]:
        """A fresh file name in the partition's folder (its folder made): its full local path
        and the path the table's metadata will name it by."""
        ...

    def commit_files(self, handle: Any, column: str, values: Sequence[PartitionValue], files: Sequence[WrittenFile],
                     schema: pa.Schema, metadata: Mapping[str, str], exclusive: bool = False) -> str | None:
        """Replace the partitions with exactly ``files`` in one commit based on the handle's
        version; return the committed version (the handle then reads it). As
        :meth:`LakeTable.overwrite` otherwise.

        Raises:
            TransientDatabaseError: another writer changed these partitions since (nothing
                committed; the files are deleted).
        """
        ...
