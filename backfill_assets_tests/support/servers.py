"""Servers the tests start besides the embedded one: the machine's own PostgreSQL (Debian's
package), with its default settings, listening on a Unix socket only."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Where Debian's packages put each major version's programs.
DEBIAN_BIN = Path("/usr/lib/postgresql")


def server_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder (None if there is none)."""
    found = sorted((p / "bin" for p in DEBIAN_BIN.glob("*") if (p / "bin" / "initdb").exists()),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return found[-1] if found else None


def _as_owner(owner: str | None, argv: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root: run them as the package's own system user.
    return ["runuser", "-u", owner, "--", *argv] if owner else argv


def _traversable(folder: Path) -> None:
    """Let the server's own user pass through ``folder`` and its parents (pytest makes its
    temporary root private to the user who runs it)."""
    for part in [folder, *folder.parents]:
        mode = part.stat().st_mode
        if not mode & stat.S_IXOTH:
            part.chmod(mode | stat.S_IXOTH)


@contextlib.contextmanager
def server_folder(prefix: str) -> Iterator[Path]:
    """A folder for a server the tests start, outside pytest's temporary root: the server runs
    as a user of its own, and pytest makes that root private again whenever another pytest
    starts on the machine, which would cut a running server off from its files."""
    folder = Path(tempfile.mkdtemp(prefix=f"bfa-{prefix}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def default_settings_server(folder: Path) -> Iterator[str]:
    """Start a server of the machine's PostgreSQL in ``folder`` with initdb's defaults (only
    where it listens changes: a socket in ``folder``, no TCP), yield its admin URL, stop it."""
    bin_dir = server_bin()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server is installed (apt-get install postgresql); `make test` installs it")
    owner = "postgres" if os.geteuid() == 0 else None
    folder.mkdir(parents=True, exist_ok=True)
    data, socket = folder / "data", folder / "socket"
    socket.mkdir(exist_ok=True)
    if owner:
        shutil.chown(folder, owner)
        shutil.chown(socket, owner)
        folder.chmod(0o755)
        _traversable(folder.parent)
    subprocess.run(_as_owner(owner, [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                                     "--encoding=UTF8", "--no-instructions"]),
                   check=True, capture_output=True)
    log = folder / "server.log"
    subprocess.run(_as_owner(owner, [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-o",
                                     f"-c listen_addresses='' -k {socket}", "start"]),
                   check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@/postgres?host={socket}"
    finally:
        subprocess.run(_as_owner(owner, [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True)
