"""The error hierarchy of backfill_assets.

Every error the core raises on purpose is a :class:`BackfillError`. Each family has an
``exit_code`` used by the command line, and a ``retryable`` flag: callers decide what to retry
by class, never by parsing a message. Messages are built from fields and never contain a
connection string or a password.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class BackfillError(Exception):
    """Root of every error raised on purpose by backfill_assets."""

    exit_code = 1
    retryable = False


class SpecError(BackfillError):
    """The spec, the command line or the catalog disagree: nothing was written."""

    exit_code = 2


class ConnectionConfigError(BackfillError):
    """The database cannot be reached or the credential is missing or wrong."""

    exit_code = 3


class SourceDataError(BackfillError):
    """The source data cannot be backfilled safely as declared (ties, NULL ordering values)."""

    exit_code = 4

    def __init__(self, problem: str, hint: str, examples: Sequence[str] = ()) -> None:
        self.problem = problem
        self.hint = hint
        self.examples = tuple(examples)
        text = problem
        if self.examples:
            text += " (for example " + "; ".join(self.examples) + ")"
        super().__init__(f"{text}. {hint}")


class TiedRowsError(SourceDataError):
    """Rows that tie on every ordering column within a key, yet differ (core.planning)."""


class LakeValueError(SourceDataError):
    """A value a lake column cannot hold exactly, or whose PostgreSQL text cannot be rendered
    from Arrow: NaN in a numeric(p,s), an infinite or BC date or time stamp, a year after 9999."""


@dataclass(frozen=True)
class TransformProblem:
    """One construct of ``transform_sql`` that can change its rows between runs."""

    kind: str  # volatility | session | order | equal-but-different | untrusted
    construct: str
    line: int | None  # in the user's transform_sql, 1-based
    column: int | None
    snippet: str  # the SQL text from that position, shortened
    problem: str
    instead: str

    def describe(self) -> str:
        where = f" at line {self.line}, column {self.column}" if self.line is not None else ""
        near = f" (`{self.snippet}`)" if self.snippet else ""
        return f"{self.construct}{where}{near}: {self.problem}. Instead: {self.instead}"


class TransformError(SpecError):
    """transform_sql can give other rows on another run from the same snapshot."""

    def __init__(self, problems: Sequence[TransformProblem]) -> None:
        self.problems = tuple(problems)
        listed = " | ".join(f"{n}. {p.describe()}" for n, p in enumerate(self.problems, 1))
        super().__init__(
            f"transform_sql is refused: {len(self.problems)} construct(s) can make its rows "
            f"differ between runs from the same snapshot: {listed}"
        )


class SnapshotError(BackfillError):
    """The source changed under a snapshot that was pinned as immutable."""

    exit_code = 4


@dataclass(frozen=True)
class StageDifference:
    """One partition whose stages A and B disagree: each differing reading as ``(a, b)``."""

    partition: str
    readings: dict[str, tuple[object, object]]

    def describe(self) -> str:
        listed = ", ".join(f"{name} {a} vs {b}" for name, (a, b) in self.readings.items())
        return f"{self.partition}: {listed}"


class DeterminismError(BackfillError):
    """The two independent stage builds disagree, or break the target grain.

    ``problems`` are the plan's problems, for people; ``differences`` the partitions whose
    stages differ, with the readings that differ (empty where only the grain is broken, or
    where the caller did not give them).
    """

    exit_code = 5

    def __init__(
        self, plan_id: str, problems: Sequence[str], differences: Sequence[StageDifference] = (),
    ) -> None:
        self.plan_id = plan_id
        self.problems = tuple(problems)
        self.differences = tuple(differences)
        super().__init__(
            f"plan {plan_id[:16]} is refused: " + "; ".join(self.problems)
            + ". Nothing was written to the target and the plan cannot be approved; "
            "fix the transform or the ordering and plan again."
        )


class StageError(BackfillError):
    """The stages cannot be built as asked (one stage selected without the other)."""

    exit_code = 5


class ApprovalError(BackfillError):
    """An approval is missing, or does not match the plan or the current stages.

    ``plan_id``: the plan concerned, where known; ``partitions``: the partitions concerned,
    where the refusal names some.
    """

    exit_code = 6

    def __init__(self, message: str, *, plan_id: str | None = None, partitions: Sequence[str] = ()) -> None:
        self.plan_id = plan_id
        self.partitions = tuple(partitions)
        super().__init__(message)


class PlanReferenceError(SpecError, ApprovalError):
    """A ``--plan`` (or ``plan_id``) that is not a plan id or a prefix of one: a bad argument
    (exit 2, from :class:`SpecError`, first in the method resolution order).

    It is an :class:`ApprovalError` too, so a caller that guards a plan lookup by that class
    keeps catching it.
    """

    def __init__(self, reference: str, min_prefix: int) -> None:
        self.reference = reference
        self.min_prefix = min_prefix
        ApprovalError.__init__(
            self, f"--plan must be a plan id (at least {min_prefix} hex digits of it), as printed by plan"
        )


class ApprovalOutdatedError(ApprovalError):
    """An approval no longer covers some partitions: their target is not what it was given
    against (``reasons``: partition -> why, for people)."""

    def __init__(self, approval_id: int, plan_id: str, reasons: dict[str, str]) -> None:
        self.approval_id = approval_id
        self.plan_id = plan_id
        self.reasons = dict(reasons)
        listed = "; ".join(f"{label}: {why}" for label, why in self.reasons.items())
        super().__init__(
            f"approval {approval_id} of plan {plan_id[:16]} no longer covers partition(s) "
            f"{', '.join(self.reasons)} ({listed}). Those partitions were not written; review "
            "the target as it is now and approve the plan again to replace it.",
            plan_id=plan_id, partitions=list(self.reasons),
        )


class KeysElsewhereError(ApprovalOutdatedError):
    """With ``records_can_move``, business keys the partitions ``partitions`` are about to get
    already lie in other partitions of the lake table (``elsewhere``), at the version the write
    would be committed on: a writer put them there after the plan closed its scope, and the
    write would leave those keys in two partitions. Nothing was written. Re-approving does
    not help: a new plan moves those keys with their partitions (or refuses keys found in two
    partitions). ``count``: how many such keys; ``examples``: a few, with their partition."""

    def __init__(self, approval_id: int, plan_id: str, target: str, version: str | None, partitions: Sequence[str],
                 elsewhere: Sequence[str], count: int, examples: Sequence[str]) -> None:
        self.approval_id = approval_id
        self.plan_id = plan_id
        self.target = target
        self.version = version
        self.elsewhere = tuple(elsewhere)
        self.count = count
        self.examples = tuple(examples)
        where = ", ".join(self.elsewhere)
        self.reasons = {
            label: f"{count} business key(s) written here already lie in partition(s) {where}" for label in partitions
        }
        listed = f" (for example {'; '.join(self.examples)})" if self.examples else ""
        at = f" at version {version}" if version is not None else ""
        ApprovalError.__init__(
            self,
            f"approval {approval_id} of plan {plan_id[:16]} no longer covers partition(s) {', '.join(partitions)}: "
            f"{count} business key(s) they would get already lie in partition(s) {where} of {target}{at}"
            f"{listed}, put there since the plan was made; writing them would leave those keys in two "
            "partitions. Nothing was written. Plan again: the new plan replaces those partitions too, "
            "moving the keys (or refuses keys found in two partitions).",
            plan_id=plan_id, partitions=list(partitions),
        )


@dataclass(frozen=True)
class FailedPartition:
    """A partition a run of an approval failed, not verified by a run of it since."""

    partition: str
    run_id: str
    error: str | None


class ApprovalHaltedError(ApprovalError):
    """A run of an approval that would replace partitions after an earlier run of the same
    approval failed a partition not verified since: apply stops after its first failure, across
    the runs of a multi-run backfill too. Nothing was written."""

    def __init__(self, approval_id: int, plan_id: str, failed: Sequence[FailedPartition]) -> None:
        self.approval_id = approval_id
        self.failed = tuple(failed)
        listed = "; ".join(
            f"{f.partition} (run {f.run_id}: {_shortened(f.error or 'no error recorded')})" for f in self.failed
        )
        super().__init__(
            f"approval {approval_id} of plan {plan_id[:16]} stopped after a failure: partition(s) {listed} "
            "failed and have not been verified since, so no run of this approval replaces another "
            "partition. Nothing was written. Fix the cause, then run the failed partition(s) again "
            "(re-execute the failed run, or materialize them with this run's other partitions); "
            "the remaining partitions follow once they are verified.",
            plan_id=plan_id, partitions=[f.partition for f in self.failed],
        )


def _shortened(text: str, most: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= most else text[: most - 3] + "..."


class VerificationError(BackfillError):
    """A fingerprint read back does not equal the one expected."""

    exit_code = 7

    def __init__(self, partition: str, step: str, expected: object, actual: object,
                 detail: str | None = None) -> None:
        self.partition = partition
        self.step = step
        self.expected = expected
        self.actual = actual
        self.detail = detail  # e.g. the first differing keys (core.diff)
        super().__init__(
            f"partition {partition}: {step} failed: expected {expected}, got {actual}"
            + (f"; {detail}" if detail else "")
        )


@dataclass(frozen=True)
class HeldLock:
    """A lock another session held on a relation of the spec when a wait of ours ran out."""

    relation: str  # schema.name
    mode: str  # as pg_locks names it: AccessExclusiveLock, RowShareLock, ...
    pid: int

    def describe(self) -> str:
        words = "".join(f" {ch}" if ch.isupper() else ch for ch in self.mode.removesuffix("Lock")).strip().upper()
        return f"{self.relation} ({words} lock held by server process {self.pid})"


SAFE_TO_RETRY = "it is safe to retry"


class TransientDatabaseError(BackfillError):
    """A lock or statement timeout, a serialization failure or a deadlock: safe to retry.

    ``lock_wait``: a lock timeout (the statement waited for a lock and gave up). ``held``:
    what other sessions held on the spec's relations when it did (core.waits), which the
    message names.
    """

    exit_code = 8
    retryable = True

    def __init__(self, problem: str, *, lock_wait: bool = False, held: Sequence[HeldLock] = ()) -> None:
        self.problem, self.lock_wait, self.held = problem, lock_wait, tuple(held)
        named = ""
        if held:
            named = "; it waited for a lock that another session holds on " + ", ".join(h.describe() for h in held)
        super().__init__(f"{problem}{named}; {SAFE_TO_RETRY}")

    def naming(self, held: Sequence[HeldLock]) -> TransientDatabaseError:
        """The same error, naming what was held."""
        return TransientDatabaseError(self.problem, lock_wait=self.lock_wait, held=held)


class ConcurrentRunError(BackfillError):
    """Another run holds the lock this one needs."""

    exit_code = 8
    retryable = True


class SessionNotPinnedError(BackfillError):
    """The connection reading a stage does not have the pinned settings (db.pin_session) its
    text forms depend on: with extra_float_digits below 1 floats would be read rounded."""


class LakeTargetError(BackfillError):
    """A lake table (or its library) refused or failed a read or write that the checks before
    it did not foresee: a file missing under the table, a constraint, an unsupported table
    feature. Nothing of the partition at hand was committed."""
