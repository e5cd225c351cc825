"""The core of backfill_assets: the whole process, provable against a real database, without
Dagster.

The steps, in process order (each a module here), each written once:

1. ``spec`` - the declared backfill (in the words of ``vocabulary``); ``resolve`` - inspect
   read-only;
2. ``plan`` - fix the source, build each partition twice, compare the builds and store the
   plan; ``stages`` - the stage checks on their own;
3. ``approve`` - review the plan against the target and record the approval; ``preview`` -
   the change preview a person approves from; ``coverage`` - what an approval still covers,
   and when it expires;
4. ``apply`` - replace one partition (or group) per transaction, verified;
5. the ledger records every run; ``diff`` compares a stage with the target;
6. ``audit`` - later: does each verified partition still hold what was verified?

Where a step needs the source, the snapshot or the stages, it asks the spec's build engine
(``build``: chosen once by ``engine.type``, each engine one folder of ``engines``, what each
supports read by ``supports``); where it needs the target, the target engine its ``context``
holds (``targets``). What the engines share sits below them: ``planning`` (the plan's rules),
``catalog`` (the catalog model), ``differences``,
``moves``, ``profiling`` (what ``profile`` asks every engine's source), ``duck`` (every DuckDB
connection), the ``lake`` folder (Delta and Iceberg targets), the ``pinned`` folder (a source
pinned at a version, its sensor, what the engines over it share) and the ``comparison`` folder (two relations compared in DuckDB by canonical text); ``errors``,
``progress`` and ``waits`` serve every step. The other families sit in folders:
``fingerprint`` (format 3, its readings in PostgreSQL and over Arrow, and the plan and
snapshot ids), ``store``
(the control store: plans, approvals, ledger), ``profile`` (proposing a key and a tiebreak)
and ``pg`` (PostgreSQL: connections, the catalog, the SQL builders, the embedded server).
"""
