"""Connections: the URL comes from a named environment variable and never leaves this module.

Every connection is pinned to the session settings that the canonical fingerprint depends on
(docs/fingerprint.md), so the same rows give the same digest in any session, and carries its
finite waits (:class:`Limits`) from the first byte: they are connection options, set by the
server before it runs a statement, so no code path can run one without them.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from urllib.parse import urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from backfill_assets.core.errors import ConcurrentRunError, ConnectionConfigError, TransientDatabaseError
from backfill_assets.core.vocabulary import Limits

# The settings a digest depends on. extra_float_digits=1 is PostgreSQL's shortest exact form.
PINNED_SETTINGS: tuple[tuple[str, str], ...] = (
    ("TimeZone", "UTC"),
    ("DateStyle", "ISO, YMD"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "1"),
    ("bytea_output", "hex"),
    ("client_encoding", "UTF8"),
)

# Not a digest's dependency but its cost: JIT compiles each statement's expressions anew, and
# for one partition's digest (a SHA-256 per row) compiling costs more than it saves
# (BENCHMARKS.md, "Format 3").
# Nor is plan_cache_mode: a statement psycopg prepares (from its fifth run on) keeps the generic
# plan the server made then, and one made while a target was small (empty at the start of an
# apply) scans the whole table however large the apply makes it: each partition's reading then
# read every row written before it (8,760 hour windows: 62M rows read in 5 s, quadratic). A
# custom plan per execution reads each partition through its index, at the cost of planning it.
SESSION_SETTINGS = (*PINNED_SETTINGS, ("jit", "off"), ("plan_cache_mode", "force_custom_plan"))

_PIN_SESSION = sql.SQL("SELECT {}").format(sql.SQL(", ").join(
    sql.SQL("set_config({}, {}, false)").format(sql.Placeholder(f"name{i}"), sql.Placeholder(f"value{i}"))
    for i in range(len(SESSION_SETTINGS))
))
_PIN_VALUES = {f"{part}{i}": v for i, pair in enumerate(SESSION_SETTINGS) for part, v in zip(("name", "value"), pair)}
_REPEATABLE_READ = sql.SQL("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
_READ_COMMITTED = sql.SQL("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
_REPEATABLE_READ_ONLY = sql.SQL("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")


class DatabaseUrl:
    """A connection URL that does not print itself.

    ``str()`` and ``repr()`` say which variable it came from, never the value.
    """

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source

    def __repr__(self) -> str:
        return f"DatabaseUrl(from {self.source}, value hidden)"

    __str__ = __repr__

    def reveal(self) -> str:
        """The URL itself, for the driver only."""
        return self._value

    def redact(self, text: str) -> str:
        """Remove the URL, its password and any user info or password option from ``text``.

        Works on malformed URLs too: libpq may quote the unparsable part back.
        """
        secrets = {self._value}
        try:
            params = conninfo_to_dict(self._value)
        except psycopg.ProgrammingError:
            params = {}
        for candidate in (params.get("password"), _url_password(self._value)):
            if candidate:
                secrets.add(str(candidate))
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, "[redacted]")
        text = _USERINFO.sub(r"\1[redacted]@", text)
        return _PASSWORD_OPTION.sub(r"\1[redacted]", text)


_USERINFO = re.compile(r"(//)[^/@\s]*@")
_PASSWORD_OPTION = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)


def _url_password(value: str) -> str | None:
    try:
        return urlsplit(value).password
    except ValueError:
        return None


def url_from_env(name: str, environ: Mapping[str, str] | None = None) -> DatabaseUrl:
    """Read the connection URL from the environment variable ``name``.

    Raises:
        ConnectionConfigError: the variable is unset or empty.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(name, "")
    if not value.strip():
        raise ConnectionConfigError(
            f"environment variable {name} is not set; export it with the PostgreSQL URL "
            f"(for example postgresql://user@host:5432/db), or pass --embedded to use the "
            f"project's own PostgreSQL"
        )
    return DatabaseUrl(value, source=f"${name}")


def pin_session(conn: psycopg.Connection) -> None:
    """Set the session settings every fingerprint depends on (and JIT off), in one round trip."""
    conn.execute(_PIN_SESSION, _PIN_VALUES)


_LIMITS_IN_FORCE = sql.SQL(
    "SELECT name, setting FROM pg_settings WHERE name IN ('lock_timeout', 'statement_timeout')"
)
_SET_LIMITS = sql.SQL(
    "SELECT set_config('lock_timeout', %(lock)s, false), set_config('statement_timeout', %(statement)s, false), "
    "set_config('work_mem', coalesce(%(work_mem)s, current_setting('work_mem')), false)"
)


def enforce_limits(conn: psycopg.Connection, limits: Limits) -> None:
    """Make sure ``limits`` are in force on ``conn``: a pooler that drops startup options
    (PgBouncer with ``ignore_startup_parameters = options``) would otherwise leave the session
    without them. Sets them for the session when they are not (the check reads settings only)."""
    found = dict(conn.execute(_LIMITS_IN_FORCE).fetchall())
    if found != {"lock_timeout": str(limits.lock_timeout_ms), "statement_timeout": str(limits.statement_timeout_ms)}:
        conn.execute(_SET_LIMITS, {"lock": f"{limits.lock_timeout_ms}ms",
                                   "statement": f"{limits.statement_timeout_ms}ms", "work_mem": limits.work_mem})


def connect(url: DatabaseUrl, limits: Limits, *, application_name: str = "backfill_assets") -> psycopg.Connection:
    """Open a pinned connection that carries ``limits`` from its first statement; a failure is
    a one-line error without the URL or password.

    Options the URL (or ``PGOPTIONS``) already gives are kept; the limits come after them, so
    they win.

    Raises:
        ConnectionConfigError: the server is unreachable, refuses the credential, or the
            URL is malformed.
    """
    try:
        given = conninfo_to_dict(url.reveal()).get("options") or os.environ.get("PGOPTIONS", "")
        conn = psycopg.connect(
            url.reveal(), autocommit=True, application_name=application_name, connect_timeout=10,
            options=limits.options(given),
        )
    except psycopg.ProgrammingError as err:
        problem = f"the URL in {url.source} is malformed: {_one_line(url.redact(str(err)))}"
    except psycopg.OperationalError as err:
        problem = f"cannot connect to the database in {url.source}: {_one_line(url.redact(str(err)))}"
    else:
        pin_session(conn)
        enforce_limits(conn, limits)
        return conn
    # Raised outside the except blocks: the driver's exception, which may quote the URL,
    # is neither the cause nor the context of ours.
    raise ConnectionConfigError(problem)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Connections:
    """A spec's connections, by the role each plays.

    - The **data**: the source, the snapshot, the stages and the target (the spec's
      ``database_url_env``). Calling the object opens one.
    - The **control store**: the plans, the approvals, the ledger, and the locks that keep
      runs of a spec and backfills of a partition apart (``control_database_url_env``). A spec
      that names none keeps them in its data database, as every PostgreSQL spec always has:
      then :meth:`control` hands back the data connection itself, and the two roles share its
      transactions.

    Every connection carries ``limits`` from its first statement; errors never contain a URL.
    Either URL may be given as what reads it (a variable, the embedded server), called when a
    connection of that role is first opened: a step that opens none needs neither.
    """

    def __init__(self, url: DatabaseUrl | Callable[[], DatabaseUrl], limits: Limits,
                 application_name: str = "backfill_assets",
                 control_url: DatabaseUrl | Callable[[], DatabaseUrl] | None = None) -> None:
        self._url, self._control_url = url, control_url
        self.limits, self.application_name = limits, application_name
        self._reading = threading.Lock()  # two builds may open their first connections at once

    def __call__(self) -> psycopg.Connection:
        """A new connection to the data."""
        with self._reading:
            if callable(self._url):
                self._url = self._url()  # read once, when the first connection is opened
            url = self._url
        return connect(url, self.limits, application_name=self.application_name)

    @property
    def separate(self) -> bool:
        """Whether the control store is a database of its own."""
        return self._control_url is not None

    @contextlib.contextmanager
    def control(self, data: psycopg.Connection) -> Iterator[psycopg.Connection]:
        """The control store's connection for a run working on ``data``: ``data`` itself when
        the control store is the data database, else a new connection, closed on exit."""
        if self._control_url is None:
            yield data
            return
        url = self._control_url() if callable(self._control_url) else self._control_url
        with connect(url, self.limits, application_name=self.application_name) as conn:
            yield conn


def connection_factory(url: DatabaseUrl | Callable[[], DatabaseUrl], limits: Limits,
                       application_name: str = "backfill_assets",
                       control_url: DatabaseUrl | Callable[[], DatabaseUrl] | None = None) -> Connections:
    """A spec's connections (:class:`Connections`): calling it opens a new pinned connection to
    the data (``url``) with ``limits``; ``control_url``: the control store's database, if
    another. Either may be what reads the URL when first needed, so that a command that never
    opens a connection of that role never needs it."""
    return Connections(url, limits, application_name, control_url)


_TRANSIENT = (
    pg_errors.LockNotAvailable,
    pg_errors.QueryCanceled,
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
)


def driver_error(err: BaseException) -> psycopg.Error | None:
    """The driver's error behind ``err``: itself, or the one a library wraps (SQLAlchemy keeps
    it as ``orig``: an Iceberg catalog kept in PostgreSQL); None if there is none."""
    if isinstance(err, psycopg.Error):
        return err
    orig = getattr(err, "orig", None)
    return orig if isinstance(orig, psycopg.Error) else None


def as_transient(err: BaseException, what: str) -> TransientDatabaseError | None:
    """The :class:`TransientDatabaseError` a driver error (or a library's wrapping one) maps
    onto (a lock or statement timeout, a serialization failure, a deadlock), or None for any
    other error."""
    err = driver_error(err)
    if not isinstance(err, _TRANSIENT):
        return None
    first = _one_line(str(err).strip().splitlines()[0]) if str(err).strip() else ""
    return TransientDatabaseError(f"{what}: {err.__class__.__name__}: {first} (its transaction was rolled back)",
                                  lock_wait=isinstance(err, pg_errors.LockNotAvailable))


@contextlib.contextmanager
def transient_errors(what: str) -> Iterator[None]:
    """Map lock timeouts, statement timeouts, serialization failures and deadlocks onto
    :class:`TransientDatabaseError` (retryable by class)."""
    try:
        yield
    except _TRANSIENT as err:
        raise as_transient(err, what) from err


@contextlib.contextmanager
def repeatable_read(conn: psycopg.Connection, *, read_only: bool = False) -> Iterator[None]:
    """A REPEATABLE READ transaction: every statement in it reads the same snapshot."""
    with conn.transaction():
        conn.execute(_REPEATABLE_READ_ONLY if read_only else _REPEATABLE_READ)
        yield


@contextlib.contextmanager
def imported_snapshot(conn: psycopg.Connection, name: str, *, read_only: bool = False) -> Iterator[None]:
    """A REPEATABLE READ transaction that reads the snapshot another session exported with
    ``pg_export_snapshot()`` (as parallel ``pg_dump`` does): every statement in it sees exactly
    the rows that session sees, whatever committed since. The exporting transaction must still
    be open. The name is a server-made token, written as a literal: a utility statement takes
    no bound parameter."""
    with conn.transaction():
        conn.execute(_REPEATABLE_READ_ONLY if read_only else _REPEATABLE_READ)
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)))
        yield


_EXPORT_SNAPSHOT = sql.SQL("SELECT pg_export_snapshot()")


def export_snapshot(conn: psycopg.Connection) -> str:
    """Export the snapshot of ``conn``'s REPEATABLE READ transaction (its first statement must
    not have run yet in another isolation): the name other sessions import it by."""
    row = conn.execute(_EXPORT_SNAPSHOT).fetchone()
    assert row is not None
    return str(row[0])


@contextlib.contextmanager
def read_committed(conn: psycopg.Connection) -> Iterator[None]:
    """A READ COMMITTED transaction whatever the server's default: each statement reads what
    is committed when it starts, so a read after a table lock sees every write the lock
    waited for (under REPEATABLE READ the first statement, even a set_config, fixes an
    older snapshot)."""
    with conn.transaction():
        conn.execute(_READ_COMMITTED)
        yield


_TRY_LOCK = {
    False: sql.SQL("SELECT pg_try_advisory_lock(hashtextextended(%(key)s, 0))"),
    True: sql.SQL("SELECT pg_try_advisory_lock_shared(hashtextextended(%(key)s, 0))"),
}
_UNLOCK = {
    False: sql.SQL("SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0))"),
    True: sql.SQL("SELECT pg_advisory_unlock_shared(hashtextextended(%(key)s, 0))"),
}


@contextlib.contextmanager
def advisory_session_lock(conn: psycopg.Connection, key: str, what: str, *, shared: bool = False) -> Iterator[None]:
    """Hold a session-level advisory lock on ``key`` or refuse at once. A ``shared`` lock
    admits other shared holders and refuses only an exclusive one (and the reverse)."""
    got = conn.execute(_TRY_LOCK[shared], {"key": key}).fetchone()
    if not got or not got[0]:
        raise ConcurrentRunError(f"{what} is already running in another session; wait for it")
    try:
        yield
    finally:
        if not conn.closed:
            conn.execute(_UNLOCK[shared], {"key": key})


# What the core takes to open connections: the data by calling it, the control store by
# Connections.control.
ConnectionFactory = Connections
