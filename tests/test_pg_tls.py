"""STORE-1 on PostgreSQL over TLS: `sslmode` and `sslrootcert` as libpq reads them.

A throwaway cluster runs with `ssl=on` and a certificate signed by a CA the test makes
with `openssl`. Runs, their journaled steps (on the driven connections of a blocking step
and the shared pool of an async one) and a worker all connect with `sslmode=verify-full`,
and `pg_stat_ssl` shows every such connection encrypted.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap

import pytest

import composeai as compose
from composeai import _core, _engine
from composeai.errors import ComposeError

pytestmark = pytest.mark.parametrize("store_kind", ["postgresql"], indirect=True)


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_certs(where: str, ca: str) -> None:
    """`{ca}.crt` (a CA), and `server.crt`/`server.key` signed by it for 127.0.0.1."""
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
        "-subj", f"/CN={ca}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=where,
    )  # fmt: skip
    if os.path.exists(os.path.join(where, "server.key")):
        return
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
        cwd=where,
    )  # fmt: skip
    with open(os.path.join(where, "server.ext"), "w") as f:
        f.write(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
        )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext",
        cwd=where,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tls_cluster():
    import _pg

    bindir = _pg.find_bindir()
    if bindir is None or shutil.which("openssl") is None:
        reason = "PostgreSQL (initdb, pg_ctl) and openssl are needed for the TLS tests"
        if os.environ.get("CI"):
            pytest.fail(reason + " (required under CI)")
        pytest.skip(reason)
    cluster = _pg.Cluster(bindir)
    certs = os.path.join(cluster.dir, "certs")
    os.mkdir(certs)
    _make_certs(certs, "test-ca")
    _make_certs(certs, "other-ca")  # a CA that did not sign the server's certificate
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for name in os.listdir(certs) + [""]:
            os.chown(os.path.join(certs, name), owner.pw_uid, owner.pw_gid)
    os.chmod(os.path.join(certs, "server.key"), 0o600)
    os.chmod(certs, 0o755)
    cluster.start(
        "ssl=on",
        f"ssl_cert_file={certs}/server.crt",
        f"ssl_key_file={certs}/server.key",
    )
    cluster.certs = certs
    yield cluster
    cluster.stop()


def _psql(cluster, sql: str) -> str:
    binary = os.path.join(cluster.bindir, "psql")
    out = subprocess.run(
        [binary, "-qAt", cluster.url().split("?")[0], "-c", sql],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _encryption(cluster, app: str) -> list[str]:
    """`pg_stat_ssl.ssl` of each open connection named `app`."""
    return _psql(
        cluster,
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
        f"WHERE a.application_name = '{app}'",
    ).split()


WORKER_FLOWS = """
import os
import subprocess

import composeai as compose

queue = compose.Queue("tls")


@compose.task
def encryption() -> list:
    # Asked while this worker's connections are open.
    out = subprocess.run(
        [os.environ["TEST_PSQL"], "-qAt", os.environ["TEST_PLAIN_URL"], "-c",
         "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
         "WHERE a.application_name = 'tls-worker'"],
        capture_output=True, text=True, check=True,
    )
    return out.stdout.split()


@compose.flow
def checked() -> list:
    return encryption()
"""


def test_store_1_runs_steps_and_a_worker_connect_with_verify_full(
    tls_cluster, tmp_path, monkeypatch
):
    """STORE-1: with `sslmode=verify-full` and the CA as `sslrootcert`, a blocking flow's
    steps (driven connections), an async flow's steps (the shared pool) and a
    `compose worker` executing a queued run all connect encrypted."""
    ca = os.path.join(tls_cluster.certs, "test-ca.crt")
    url = tls_cluster.url("tls1", sslmode="verify-full", sslrootcert=ca)
    monkeypatch.setenv("COMPOSE_STORE", url + "&application_name=tls-test")
    _engine.reset_store()

    @compose.task
    def inc(x: int) -> int:
        return x + 1

    @compose.task
    async def ainc(x: int) -> int:
        return x + 1

    @compose.flow
    def blocking(n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    @compose.flow
    async def awaiting(n: int) -> int:
        x = 0
        for _ in range(n):
            x = await ainc.arun(x)
        return x

    assert blocking(3) == 3
    assert asyncio.run(awaiting.arun(3)).output == 3
    seen = _encryption(tls_cluster, "tls-test")
    assert len(seen) >= 2 and set(seen) == {"t"}, seen
    journal = _psql(tls_cluster, "SELECT count(*) FROM tls1.journal")
    assert journal == "6"

    (tmp_path / "tlsflows.py").write_text(textwrap.dedent(WORKER_FLOWS))
    env = {
        **os.environ,
        "COMPOSE_STORE": url + "&application_name=tls-worker",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "TEST_PSQL": os.path.join(tls_cluster.bindir, "psql"),
        "TEST_PLAIN_URL": tls_cluster.url().split("?")[0],
    }
    enqueue = "import tlsflows\nprint(tlsflows.checked.start(queue='tls').id)\n"
    made = subprocess.run(
        [sys.executable, "-c", enqueue],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    run_id = made.stdout.strip()
    worked = subprocess.run(
        [sys.executable, "-m", "composeai.cli", "worker", "--once", "--queue", "tls"]
        + ["--import", "tlsflows"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert worked.returncode == 0, worked.stderr
    row = _engine.get_store().get_run(run_id)
    assert row["status"] == "completed", row
    worker_seen = json.loads(row["output_json"])
    assert len(worker_seen) >= 1 and set(worker_seen) == {"t"}, worker_seen


def test_store_1_require_encrypts_without_a_ca_and_verifies_with_one(tls_cluster):
    """libpq's rules: `require` encrypts without checking the certificate, unless a CA is
    given (then it verifies as `verify-ca`); `verify-ca`/`verify-full` check it against
    `sslrootcert` and refuse a certificate another CA signed."""
    ok = _core.Store(tls_cluster.url("tls2", sslmode="require", application_name="tls-req"))
    assert ok.get_run("nothing") is None
    assert _encryption(tls_cluster, "tls-req") == ["t"]
    other = os.path.join(tls_cluster.certs, "other-ca.crt")
    for mode in ("require", "verify-ca", "verify-full"):
        with pytest.raises(ComposeError, match="cannot connect.*(UnknownIssuer|certificate)"):
            _core.Store(tls_cluster.url("tls2", sslmode=mode, sslrootcert=other))
    right = os.path.join(tls_cluster.certs, "test-ca.crt")
    store = _core.Store(tls_cluster.url("tls2", sslmode="verify-ca", sslrootcert=right))
    assert store.get_run("nothing") is None


def test_store_1_verify_without_a_ca_names_the_missing_file(tls_cluster, tmp_path, monkeypatch):
    """`verify-full` with no `sslrootcert` and no `~/.postgresql/root.crt` is refused
    before connecting, naming the file libpq would read and how to give a CA."""
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ComposeError, match=r"sslrootcert.*root\.crt' does not exist") as info:
        _core.Store(tls_cluster.url("tls3", sslmode="verify-full"))
    assert "sslmode=verify-full" in str(info.value)
    # The default file, when present, is the CA (as for libpq).
    (tmp_path / ".postgresql").mkdir()
    shutil.copy(os.path.join(tls_cluster.certs, "test-ca.crt"), tmp_path / ".postgresql/root.crt")
    assert _core.Store(tls_cluster.url("tls3", sslmode="verify-full")).get_run("x") is None


def test_store_1_require_against_a_server_without_tls_is_a_clear_error(pg_cluster):
    """A server with ssl off and `sslmode=require`: the error says the server does not
    accept TLS and what to change; with `prefer` the connection falls back to plain."""
    with pytest.raises(ComposeError, match="does not accept TLS") as info:
        _core.Store(pg_cluster.url("tls4", sslmode="require"))
    assert "sslmode=prefer" in str(info.value)
    assert _core.Store(pg_cluster.url("tls4", sslmode="prefer")).get_run("x") is None
