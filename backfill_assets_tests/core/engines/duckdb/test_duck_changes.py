"""What a replacement changes, compared in DuckDB by canonical text (core.comparison.compare):
the counts and the first differing keys with their columns, on adversarial values."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from backfill_assets.core.comparison import compare

FIELDS = [("day", "text"), ("id", "integer"), ("amount", "double"), ("note", "text")]  # kinds


def _table(rows):
    return pa.table({"day": [r[0] for r in rows], "id": [r[1] for r in rows],
                     "amount": pa.array([r[2] for r in rows], pa.float64()), "note": [r[3] for r in rows]})


def test_counts_and_first_keys_name_the_columns_that_differ_and_no_values():
    stage = _table([("d", 1, 1.0, "same"), ("d", 2, -0.0, "x"), ("d", 3, 2.5, None), ("d", 5, 1.0, "new\tline"),
                    ("e", 9, 1.0, "other day")])
    target = _table([("d", 1, 1.0, "same"), ("d", 2, 0.0, "x"), ("d", 3, 2.5, ""), ("d", 4, 7.0, "gone")])
    con = duckdb.connect()
    con.register("stage_rows", stage)
    con.register("target_rows", target)
    counts = con.execute(compare.change_counts("stage_rows", "target_rows", "day", ["id"], FIELDS),
                         {"partition": "d"}).fetchall()[0]
    assert counts == (1, 1, 2, 1)  # 5 added; 4 removed; 2 (-0 vs 0) and 3 (NULL vs '') changed; 1 kept
    rows = con.execute(compare.first_changes("stage_rows", "target_rows", "day", ["id"], FIELDS, 3),
                       {"partition": "d"}).fetchall()
    first = compare.first_changes_json(rows, ["id"])
    assert first == [
        {"key": {"id": "2"}, "kind": "changed", "columns": ["amount"]},
        {"key": {"id": "3"}, "kind": "changed", "columns": ["note"]},
        {"key": {"id": "4"}, "kind": "removed", "columns": []},
    ]
