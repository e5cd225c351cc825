"""The core of backfill_assets: the whole process, provable against a real database, without
Dagster.

The steps, in process order (each a module here):

1. ``spec`` - the declared backfill (in the words of ``vocabulary``); ``resolve`` - inspect
   read-only and resolve the spec into a ``context.Context`` holding its target's engine;
2. ``snapshot`` - fix the source (``moves``: the partitions moved records add); ``stages`` -
   build each partition twice; ``plan`` - compare the builds and store the plan;
3. ``approve`` - review the plan against the target and record the approval; ``coverage`` -
   what an approval still covers, and when it expires;
4. ``apply`` - replace one partition (or group) per transaction, verified;
5. the ledger records every run; ``diff`` compares a stage with the target; ``watch`` tells
   the sensors which snapshotted partitions of the source moved on.

``errors``, ``progress`` and ``waits`` serve every step. The families the steps use sit in
folders: ``targets`` (one engine per target format), ``fingerprint`` (a partition's readings,
in SQL and in Arrow, and the plan and snapshot ids), ``store`` (the control store: plans,
approvals, ledger), ``guard`` (the transform's determinism guard), ``profile`` (proposing a
key and a tiebreak) and ``pg`` (PostgreSQL: connections, the catalog, the SQL builders, the
embedded server). ``duck`` and ``spark`` run the steps on DuckDB and Spark; what they share of
a source pinned at a version is ``pinned``.
"""
