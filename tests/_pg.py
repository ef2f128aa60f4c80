"""A throwaway PostgreSQL cluster for the tests and the bench (STORE-2).

`initdb`/`pg_ctl` from the system's PostgreSQL, on a free loopback port and a
temporary data directory removed on `stop()`. As root the server runs as the
`postgres` system user (the server refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile


def find_bindir() -> str | None:
    """The directory holding `initdb` and `pg_ctl`, or None."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(on_path))
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, bindir: str, *, durable: bool = False) -> None:
        self.bindir = bindir
        self.durable = durable
        self.dir = tempfile.mkdtemp(prefix="composeai-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        self.user = "composeai"
        self._as: list[str] = []
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "running as root needs a 'postgres' system user for the test server"
                ) from None
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *cmd: str) -> None:
        out = subprocess.run(
            [*self._as, *cmd], capture_output=True, text=True, cwd=self.dir, check=False
        )
        if out.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {out.stderr or out.stdout}")

    def start(self, *settings: str) -> Cluster:
        """Starts the server; `settings` are extra `name=value` server settings."""
        b = self.bindir
        self._run(
            f"{b}/initdb", "-D", self.data, "-U", self.user, "--auth=trust", "-E", "UTF8", "-N"
        )
        opts = [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={self.dir}",
            "-c max_connections=300",
            "-c shared_buffers=64MB",
            *(f"-c {kv}" for kv in settings),
        ]
        if not self.durable:
            # Test servers trade crash safety of the server itself for speed.
            opts += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._opts = " ".join(opts)
        self.resume()
        return self

    # -- faults (STORE-40, STORE-41) ------------------------------------------

    def resume(self) -> None:
        """Starts the (initialized) server, waiting until it accepts connections."""
        log = os.path.join(self.dir, "log")
        self._run(
            f"{self.bindir}/pg_ctl", "-D", self.data, "-l", log, "-o", self._opts, "-w", "start"
        )

    def halt(self) -> None:
        """Stops the server, keeping its data, as an administrator's fast
        shutdown does: sessions are terminated, new connections refused."""
        self._run(f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        """A fast restart: every session is cut, the server is back at once."""
        log = os.path.join(self.dir, "log")
        self._run(
            f"{self.bindir}/pg_ctl",
            "-D",
            self.data,
            "-l",
            log,
            "-o",
            self._opts,
            "-m",
            "fast",
            "-w",
            "restart",
        )

    def pids(self) -> list[int]:
        """The postmaster's pid and its children's (every server process)."""
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            main = int(f.readline())
        pids = [main]
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == main:
                pids.append(int(entry))
        return pids

    def freeze(self) -> None:
        """SIGSTOPs every server process: connections are still accepted by
        the kernel, nothing is ever answered."""
        self._signal_all(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, sig: int) -> None:
        if not os.path.exists(os.path.join(self.data, "postmaster.pid")):
            return
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass  # a backend that ended meanwhile

    def url(self, schema: str = "composeai", **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"sslmode": "disable", **options}.items())
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres?schema={schema}&{query}"

    def stop(self) -> None:
        try:
            self._run(f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
