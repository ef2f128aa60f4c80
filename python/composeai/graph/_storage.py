"""Where a graph keeps its runs: `Storage`, and the store calls
the graph makes as plans (see `_drive.plan_io`).
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any

from .. import _core, _drive, _engine
from ..errors import ConfigError

# A graph's store calls are plans (see `_drive.plan_io`).
_io = _drive.plan_io
_now = _drive.run_plan
_anow = _drive.arun_plan


def _remote(store: Any) -> bool:
    return store.kind != "sqlite"


# ---------------------------------------------------------------------------
# Storage (EXT-30)


class Storage:
    """Where threads (and the graph's runs) are kept: `None` = the composeai
    store, `":memory:"` = this process only, or a store URL as for `COMPOSE_STORE`.
    `on_busy="wait"` makes a second caller wait for a busy thread."""

    def __init__(self, url: str | None = None, *, on_busy: str = "raise"):
        if on_busy not in ("raise", "wait"):
            raise ValueError(f"on_busy must be 'raise' or 'wait', got {on_busy!r}")
        if url is not None and not isinstance(url, str):
            raise TypeError(f"storage url must be a str, got {type(url).__name__}")
        # The store's own parser (STORE-1), so a graph accepts every form
        # COMPOSE_STORE does: (kind, SQLite path or redacted server URL).
        self._target: tuple[str, str] | None = None
        if url is not None and url != ":memory:":
            try:
                self._target = _core.store_target(url, "")
            except ConfigError as exc:
                raise ConfigError(
                    f"graph storage is not a store URL -- use None, ':memory:' or a store URL: {exc}"
                ) from None
            if not self._target[1]:
                raise ConfigError(
                    "graph storage is not a store URL -- use None, ':memory:' or a store URL "
                    "(sqlite:///abs/path.db, sqlite://relative/path.db, postgresql://...)"
                )
        self.url = url
        self.on_busy = on_busy
        self._store: Any = None
        self._lock = threading.Lock()
        _STORAGES.add(self)

    def __repr__(self) -> str:
        return f"Storage({self.url!r}, on_busy={self.on_busy!r})"

    def store(self):
        if self.url is None:
            return _engine.get_store()
        if self._store is not None:
            return self._store
        with self._lock:
            if self._store is None:
                if self.url == ":memory:":
                    self._store = _memory_store()
                elif self._is_postgres():
                    self._store = _core.Store(self.url)
                else:
                    assert self._target is not None
                    self._store = _core.Store(self._target[1])
            return self._store

    def _is_postgres(self) -> bool:
        return self._target is not None and self._target[0] == "postgresql"

    def _open_io(self):
        """Plan: `store()`, a server's first open made by the plan's driver."""
        if self._store is None and self._is_postgres():
            opened = yield _io(True, _core.Store, _core.Store.aopen, self.url)
            with self._lock:
                if self._store is None:
                    self._store = opened
        return self.store()

    async def aopen(self):
        """`store()` for an async caller: a server's first open (connection and
        schema check) is awaited off the loop."""
        if self.url is None:
            return await _engine.aget_store()
        return await _anow(self._open_io())


def _flush_all() -> None:
    """A settled graph run's spans are written with its settlement;
    spans of a run that has not settled ride with later commits or the
    background writer, and whatever is still queued at exit is written then."""
    stores = [_engine._store, *(s._store for s in list(_STORAGES))]
    for store in stores:
        if store is not None:
            try:
                store.flush()
            except Exception:  # noqa: BLE001, S110 -- exiting; span writes warn once elsewhere
                pass


_STORAGES: weakref.WeakSet[Storage] = weakref.WeakSet()
atexit.register(_flush_all)


def _memory_store():
    """A store private to this process, removed when it exits."""
    import os
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="composeai-graph-")
    atexit.register(shutil.rmtree, directory, True)
    return _core.Store(os.path.join(directory, "runs.db"))


def _storage(storage: Any) -> Storage:
    if isinstance(storage, Storage):
        return storage
    return Storage(storage)
