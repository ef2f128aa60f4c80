//! The store's connections write a commit's WAL frames with one system call.
//!
//! SQLite appends each frame of a commit to the WAL with two writes, its
//! 24-byte header and then its page, so a commit of ten pages costs twenty
//! `pwrite`s, and, as a frame is not page-aligned in the file, about thirty
//! page-cache updates in the kernel. This VFS is SQLite's default one
//! (`unix`) with a layer on the WAL file that gathers contiguous writes in
//! memory and writes them at once:
//!
//! - when the page of a commit frame (one whose header carries the database
//!   size) has been gathered, so the commit is in the file before SQLite
//!   publishes it in the wal-index (which only happens after that write
//!   returned; its error fails the commit as a failed `pwrite` would);
//! - before anything else touches the WAL file (a read, a sync, a truncate,
//!   its size, a file control, closing it), so SQLite reads what it wrote;
//! - before any wal-index lock or barrier of the connection's database file,
//!   so no frame written inside a transaction is still in memory once its
//!   write lock is released (a rolled-back transaction's spilled frames reach
//!   the file while the lock is held, as without this layer);
//! - when the gathered bytes reach `GATHER_LIMIT` (a long transaction that
//!   spills pages).
//!
//! The file's content after each of these points is the one the same writes
//! made one by one would leave, so readers in this or other processes, WAL
//! recovery after a crash, and checkpoints see no difference.
//!
//! A write that grows the WAL file also writes `EXTEND_BY` bytes of zeros
//! past its end, so the commits that follow write into pages the file
//! already has, which the kernel does for a fraction of the cost of growing
//! it, and `fdatasync` has no new file length to commit each time. Measured
//! on ext4, zeros' writes included: a 15 KiB commit (an agent call's) 11.4
//! -> 8.0 µs, a 7 KiB one (a step's) 6.5 -> 4.2 µs. Zeros are never a valid
//! frame (their salts and checksums do not match the header's), so recovery
//! and every reader stop where they begin, as they stop at the stale frames
//! a WAL that started over leaves behind. They are written only past this
//! connection's furthest write, while it holds the write lock, where no
//! committed frame can be. Every other file (database, journals, temporary
//! files) passes straight through.

use rusqlite::ffi;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// The name the store's connections open their database with.
pub const VFS_NAME: &str = "composeai-wal";
const VFS_NAME_C: &[u8] = b"composeai-wal\0";

/// Bytes gathered at most before they are written: the default VFS writes
/// at most 128 KiB per call.
const GATHER_LIMIT: usize = 1 << 16;

/// Zeros written past the end of a WAL file a write grows (see the module
/// documentation).
const EXTEND_BY: usize = 256 * 1024;

/// A WAL frame header's length; bytes 4..8 hold the database size in pages
/// after a commit frame, 0 in every other frame.
const FRAME_HEADER: usize = 24;

extern "C" {
    // SQLite 3.31+: the database file a WAL or journal file name belongs to.
    fn sqlite3_database_file_object(name: *const c_char) -> *mut ffi::sqlite3_file;
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Main,
    Wal,
    Other,
}

/// What SQLite allocates for each open file (`szOsFile` bytes): this header,
/// then the default VFS's own file at `REAL_OFFSET`.
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    role: Role,
    /// A main database file's open WAL, a WAL's main database file (both
    /// opened through this VFS by one connection), or null.
    peer: *mut ShimFile,
    gathered: Vec<u8>,
    /// File offset of `gathered[0]`.
    start: i64,
    /// The page of a commit frame is the next write: write out after it.
    commit_next: bool,
    /// The end of the furthest write since the WAL last started over: frames
    /// are appended there.
    frontier: i64,
    /// The WAL file's length as this connection last knew it, -1 before it
    /// asked. Another connection may have grown the file since (a longer
    /// file is only extended again, its zeros past this write's end) or
    /// truncated it (writes then grow it without zeros until past this).
    extent: i64,
}

const REAL_OFFSET: usize = std::mem::size_of::<ShimFile>().next_multiple_of(16);

struct Vfs(ffi::sqlite3_vfs);

// The struct is written once, before registration, and only read after.
unsafe impl Send for Vfs {}
unsafe impl Sync for Vfs {}

static VFS: OnceLock<Option<Box<Vfs>>> = OnceLock::new();
static BASE: OnceLock<BaseVfs> = OnceLock::new();

struct BaseVfs(*mut ffi::sqlite3_vfs);
unsafe impl Send for BaseVfs {}
unsafe impl Sync for BaseVfs {}

/// Registers the VFS (once per process); `Some(VFS_NAME)` when connections
/// can open with it, `None` to use SQLite's default.
pub fn name() -> Option<&'static str> {
    VFS.get_or_init(register).as_ref().map(|_| VFS_NAME)
}

fn register() -> Option<Box<Vfs>> {
    // SAFETY: plain SQLite calls; the registered struct is boxed and kept
    // for the life of the process in `VFS`.
    unsafe {
        if ffi::sqlite3_initialize() != ffi::SQLITE_OK {
            return None;
        }
        let base = ffi::sqlite3_vfs_find(std::ptr::null());
        if base.is_null() || (*base).iVersion < 1 || (*base).xOpen.is_none() {
            return None;
        }
        let _ = BASE.set(BaseVfs(base));
        // The default VFS's own entries serve every call but `xOpen`; they
        // see the same `pAppData` and `mxPathname` as through the default.
        let mut vfs = *base;
        vfs.szOsFile = c_int::try_from(REAL_OFFSET)
            .ok()?
            .checked_add((*base).szOsFile)?;
        vfs.zName = VFS_NAME_C.as_ptr().cast();
        vfs.pNext = std::ptr::null_mut();
        vfs.xOpen = Some(x_open);
        let mut boxed = Box::new(Vfs(vfs));
        if ffi::sqlite3_vfs_register(&mut boxed.0, 0) != ffi::SQLITE_OK {
            return None;
        }
        Some(boxed)
    }
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let Some(base) = BASE.get() else {
        return ffi::SQLITE_ERROR;
    };
    let f = file.cast::<ShimFile>();
    let real = file
        .cast::<u8>()
        .add(REAL_OFFSET)
        .cast::<ffi::sqlite3_file>();
    (*f).base.pMethods = std::ptr::null();
    let Some(open) = (*base.0).xOpen else {
        return ffi::SQLITE_ERROR;
    };
    let rc = open(base.0, name, real, flags, out_flags);
    if (*real).pMethods.is_null() {
        // Nothing to close: SQLite calls no method of this file.
        return rc;
    }
    let role = if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
        Role::Main
    } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
        Role::Wal
    } else {
        Role::Other
    };
    std::ptr::write(
        f,
        ShimFile {
            base: ffi::sqlite3_file {
                pMethods: methods_for((*real).pMethods),
            },
            real,
            role,
            peer: std::ptr::null_mut(),
            gathered: Vec::new(),
            start: 0,
            commit_next: false,
            frontier: 0,
            extent: -1,
        },
    );
    if role == Role::Wal && !name.is_null() {
        let main = sqlite3_database_file_object(name).cast::<ShimFile>();
        // Only a main file opened through this VFS carries these methods.
        if !main.is_null() && is_shim(&(*main).base) && (*main).role == Role::Main {
            (*main).peer = f;
            (*f).peer = main;
        }
    }
    rc
}

/// Our methods, of the default file's version (SQLite calls no method a
/// file's version lacks).
fn methods_for(real: *const ffi::sqlite3_io_methods) -> *const ffi::sqlite3_io_methods {
    // SAFETY: `real` is the non-null method table of an open file.
    match unsafe { (*real).iVersion } {
        v if v >= 3 => &METHODS_V3,
        2 => &METHODS_V2,
        _ => &METHODS_V1,
    }
}

fn is_shim(file: &ffi::sqlite3_file) -> bool {
    std::ptr::eq(file.pMethods, &METHODS_V3)
        || std::ptr::eq(file.pMethods, &METHODS_V2)
        || std::ptr::eq(file.pMethods, &METHODS_V1)
}

const fn methods(version: c_int) -> ffi::sqlite3_io_methods {
    ffi::sqlite3_io_methods {
        iVersion: version,
        xClose: Some(x_close),
        xRead: Some(x_read),
        xWrite: Some(x_write),
        xTruncate: Some(x_truncate),
        xSync: Some(x_sync),
        xFileSize: Some(x_file_size),
        xLock: Some(x_lock),
        xUnlock: Some(x_unlock),
        xCheckReservedLock: Some(x_check_reserved_lock),
        xFileControl: Some(x_file_control),
        xSectorSize: Some(x_sector_size),
        xDeviceCharacteristics: Some(x_device_characteristics),
        xShmMap: Some(x_shm_map),
        xShmLock: Some(x_shm_lock),
        xShmBarrier: Some(x_shm_barrier),
        xShmUnmap: Some(x_shm_unmap),
        xFetch: Some(x_fetch),
        xUnfetch: Some(x_unfetch),
    }
}

static METHODS_V1: ffi::sqlite3_io_methods = methods(1);
static METHODS_V2: ffi::sqlite3_io_methods = methods(2);
static METHODS_V3: ffi::sqlite3_io_methods = methods(3);

/// The default VFS's file and its method table.
unsafe fn real(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    let real = (*file.cast::<ShimFile>()).real;
    (real, &*(*real).pMethods)
}

/// Calls the default file's method `$m` (an error code if it has none).
macro_rules! forward {
    ($file:expr, $m:ident $(, $arg:expr)*) => {{
        let (real, methods) = real($file);
        match methods.$m {
            Some(m) => m(real $(, $arg)*),
            None => ffi::SQLITE_IOERR,
        }
    }};
}

/// `forward!` after the WAL file's gathered bytes are written out (see
/// `settle`); the write's error instead if it failed.
macro_rules! forward_settled {
    ($file:expr, $m:ident $(, $arg:expr)*) => {
        match settle($file) {
            ffi::SQLITE_OK => forward!($file, $m $(, $arg)*),
            rc => rc,
        }
    };
}

/// Writes what a WAL file gathered. Whatever happens, nothing stays
/// gathered: a failed write is reported once, never retried later over
/// frames written since.
unsafe fn write_out(f: *mut ShimFile) -> c_int {
    let s = &mut *f;
    if s.gathered.is_empty() {
        return ffi::SQLITE_OK;
    }
    let (real, methods) = real(f.cast());
    if s.extent < 0 {
        let mut size = 0;
        let asked = methods
            .xFileSize
            .map_or(ffi::SQLITE_IOERR, |m| m(real, &mut size));
        // Unknown, it is taken to be long enough already.
        s.extent = if asked == ffi::SQLITE_OK {
            size
        } else {
            i64::MAX
        };
    }
    let end = s.start + s.gathered.len() as i64;
    let rc = match (methods.xWrite, c_int::try_from(s.gathered.len())) {
        (Some(write), Ok(n)) => write(real, s.gathered.as_ptr().cast(), n, s.start),
        _ => ffi::SQLITE_IOERR_WRITE,
    };
    s.gathered.clear();
    if s.gathered.capacity() > GATHER_LIMIT {
        s.gathered.shrink_to(GATHER_LIMIT);
    }
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // Below the frontier, frames of this transaction may follow the write.
    if end >= s.frontier {
        extend_past(s, real, methods, end);
    }
    ffi::SQLITE_OK
}

/// Writes `EXTEND_BY` zeros past `end`, the end of a write that grew the
/// WAL file, `GATHER_LIMIT` bytes a call (the default VFS's writes are
/// shorter than 128 KiB). Best effort: the frames are written already, and
/// a later write that finds no zeros grows the file itself.
unsafe fn extend_past(
    s: &mut ShimFile,
    real: *mut ffi::sqlite3_file,
    methods: &ffi::sqlite3_io_methods,
    end: i64,
) {
    if end <= s.extent {
        return;
    }
    s.extent = end;
    let Some(write) = methods.xWrite else {
        return;
    };
    static ZEROS: OnceLock<Vec<u8>> = OnceLock::new();
    let zeros = ZEROS.get_or_init(|| vec![0; GATHER_LIMIT]);
    for _ in 0..EXTEND_BY / GATHER_LIMIT {
        if write(real, zeros.as_ptr().cast(), GATHER_LIMIT as c_int, s.extent) != ffi::SQLITE_OK {
            return;
        }
        s.extent += GATHER_LIMIT as i64;
    }
}

/// Writes out a WAL file's gathered bytes before another use of it.
unsafe fn settle(file: *mut ffi::sqlite3_file) -> c_int {
    let f = file.cast::<ShimFile>();
    if (*f).role == Role::Wal {
        write_out(f)
    } else {
        ffi::SQLITE_OK
    }
}

/// Writes out the WAL of a main database file before a wal-index lock or
/// barrier.
unsafe fn settle_peer(file: *mut ffi::sqlite3_file) -> c_int {
    let f = file.cast::<ShimFile>();
    if (*f).role == Role::Main && !(*f).peer.is_null() {
        write_out((*f).peer)
    } else {
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let f = file.cast::<ShimFile>();
    let written = settle(file);
    if !(*f).peer.is_null() {
        (*(*f).peer).peer = std::ptr::null_mut();
    }
    let rc = forward!(file, xClose);
    std::ptr::drop_in_place(&mut (*f).gathered);
    (*f).base.pMethods = std::ptr::null();
    if written != ffi::SQLITE_OK {
        written
    } else {
        rc
    }
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    n: c_int,
    at: i64,
) -> c_int {
    forward_settled!(file, xRead, buf, n, at)
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    n: c_int,
    at: i64,
) -> c_int {
    let f = file.cast::<ShimFile>();
    if (*f).role != Role::Wal || n <= 0 || at < 0 {
        return forward!(file, xWrite, buf, n, at);
    }
    let data = std::slice::from_raw_parts(buf.cast::<u8>(), n as usize);
    let s = &mut *f;
    let end = s.start + s.gathered.len() as i64;
    let len = data.len() as i64;
    // The WAL starts over with its header at offset 0.
    let frontier = if at == 0 { 0 } else { s.frontier };
    s.frontier = frontier.max(at + len);
    if !s.gathered.is_empty() && at == end && s.gathered.len() + data.len() <= GATHER_LIMIT {
        s.gathered.extend_from_slice(data);
    } else if !s.gathered.is_empty() && at >= s.start && at + len <= end {
        let from = (at - s.start) as usize;
        s.gathered[from..from + data.len()].copy_from_slice(data);
    } else {
        let rc = write_out(f);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        if data.len() >= GATHER_LIMIT {
            s.commit_next = false;
            if s.extent >= 0 {
                s.extent = s.extent.max(at + len);
            }
            return forward!(file, xWrite, buf, n, at);
        }
        s.start = at;
        s.gathered.extend_from_slice(data);
    }
    let page_of_commit = s.commit_next;
    s.commit_next = data.len() == FRAME_HEADER && data[4..8] != [0, 0, 0, 0];
    // A commit frame's header written below the frontier was rewritten in
    // place (SQLite recomputes the checksums of frames overwritten within a
    // transaction): it is the transaction's last write to the WAL. (After
    // another connection started the WAL over, an appended one can look the
    // same: written now, its page is still written right after it.)
    if page_of_commit || (s.commit_next && at < frontier) {
        return write_out(f);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let f = file.cast::<ShimFile>();
    (*f).frontier = (*f).frontier.min(size);
    (*f).extent = (*f).extent.min(size);
    forward_settled!(file, xTruncate, size)
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    forward_settled!(file, xSync, flags)
}

unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    forward_settled!(file, xFileSize, size)
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(file, xLock, level)
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(file, xUnlock, level)
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    forward!(file, xCheckReservedLock, out)
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    forward_settled!(file, xFileControl, op, arg)
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let (real, methods) = real(file);
    methods.xSectorSize.map_or(4096, |m| m(real))
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let (real, methods) = real(file);
    methods.xDeviceCharacteristics.map_or(0, |m| m(real))
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(file, xShmMap, page, size, extend, out)
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    let written = settle_peer(file);
    // A lock is not taken after a failed write; an unlock always happens
    // (nothing gathered then was committed: a commit's frames are written
    // with its last page).
    if written != ffi::SQLITE_OK && flags & ffi::SQLITE_SHM_LOCK != 0 {
        return written;
    }
    forward!(file, xShmLock, offset, n, flags)
}

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    // Normally nothing is gathered here (a commit's frames were written with
    // its last page); this write only covers uses of the WAL this layer does
    // not foresee, and has no way to report an error.
    let _ = settle_peer(file);
    let (real, methods) = real(file);
    if let Some(m) = methods.xShmBarrier {
        m(real);
    }
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    forward!(file, xShmUnmap, delete)
}

unsafe extern "C" fn x_fetch(
    file: *mut ffi::sqlite3_file,
    at: i64,
    n: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward_settled!(file, xFetch, at, n, out)
}

unsafe extern "C" fn x_unfetch(file: *mut ffi::sqlite3_file, at: i64, p: *mut c_void) -> c_int {
    forward!(file, xUnfetch, at, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::Dir;
    use rusqlite::{Connection, OpenFlags};

    /// A connection through the layer, in WAL mode with no automatic
    /// checkpoint, `pragmas` run and the tests' table created.
    fn gathering_table(path: &str, pragmas: &str) -> Connection {
        let vfs = name().expect("the VFS registers");
        let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0; \
             {pragmas} CREATE TABLE t(x INTEGER PRIMARY KEY, v TEXT)"
        ))
        .unwrap();
        conn
    }

    fn insert(conn: &Connection, v: &str) {
        conn.execute("INSERT INTO t(v) VALUES(?1)", [v]).unwrap();
    }

    fn count(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    fn integrity(conn: &Connection) -> String {
        conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn each_commit_is_in_the_wal_file_when_it_returns() {
        let dir = Dir::new();
        let path = dir.path("db");
        let writer = gathering_table(&path, "");
        // A reader through SQLite's default VFS reads the WAL file itself.
        let reader = Connection::open(&path).unwrap();
        for i in 0..200 {
            insert(&writer, &format!("{i:0>900}"));
            assert_eq!(count(&reader), i + 1);
        }
        assert_eq!(integrity(&reader), "ok");
    }

    /// A copy of the files taken while the writer is open is what a crash
    /// leaves: opening it runs WAL recovery, which checks every frame's
    /// checksum and drops the WAL from the first bad one.
    fn recovered_copy(dir: &Dir) -> Connection {
        let copy = std::path::PathBuf::from(dir.path("copy"));
        std::fs::create_dir_all(&copy).unwrap();
        for f in ["db", "db-wal"] {
            std::fs::copy(dir.path(f), copy.join(f)).unwrap();
        }
        Connection::open(copy.join("db")).unwrap()
    }

    /// The crash copy of `dir` recovers `rows` rows, intact.
    fn assert_recovers(dir: &Dir, rows: i64) {
        let copy = recovered_copy(dir);
        assert_eq!(count(&copy), rows);
        assert_eq!(integrity(&copy), "ok");
    }

    /// One transaction of `rows` rows of `width` characters, each then
    /// suffixed with `x`: with a tiny page cache its pages spill to the WAL
    /// and are written again before the commit.
    fn spilled_transaction(writer: &Connection, rows: usize, width: usize) {
        writer.execute_batch("BEGIN").unwrap();
        for i in 0..rows {
            insert(writer, &format!("{i:0>width$}"));
        }
        writer.execute("UPDATE t SET v = v || 'x'", []).unwrap();
        writer.execute_batch("COMMIT").unwrap();
    }

    #[test]
    fn a_crash_after_commits_recovers_every_one() {
        let dir = Dir::new();
        let path = dir.path("db");
        let writer = gathering_table(&path, "");
        for i in 0..300 {
            insert(&writer, &format!("{i:0>500}"));
        }
        assert_recovers(&dir, 300);
    }

    #[test]
    fn spilled_and_rewritten_frames_commit_intact() {
        let dir = Dir::new();
        let path = dir.path("db");
        // A tiny page cache spills pages to the WAL mid-transaction; writing
        // them again overwrites their frames, and the commit rewrites the
        // checksums from the first one overwritten.
        let writer = gathering_table(&path, "PRAGMA cache_size=2;");
        spilled_transaction(&writer, 400, 700);
        let reader = Connection::open(&path).unwrap();
        assert_eq!(count(&reader), 400);
        let suffixed: i64 = reader
            .query_row("SELECT count(*) FROM t WHERE v LIKE '%x'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(suffixed, 400);
        assert_eq!(integrity(&reader), "ok");
        assert_recovers(&dir, 400);
    }

    #[test]
    fn a_rolled_back_spill_never_overwrites_another_writers_commit() {
        let dir = Dir::new();
        let path = dir.path("db");
        let writer = gathering_table(&path, "PRAGMA cache_size=2;");
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        for i in 0..200 {
            insert(&writer, &format!("{i:0>700}"));
        }
        writer.execute_batch("ROLLBACK").unwrap();
        // Another connection (default VFS) now commits where the spilled
        // frames were; this writer's later commits must not bring them back.
        let other = Connection::open(&path).unwrap();
        for i in 0..50 {
            insert(&other, &format!("other {i}"));
        }
        for i in 0..50 {
            insert(&writer, &format!("mine {i}"));
        }
        assert_eq!(count(&other), 100);
        assert_eq!(integrity(&other), "ok");
        assert_recovers(&dir, 100);
    }

    #[test]
    fn the_wal_restarts_and_truncates_through_the_layer() {
        let dir = Dir::new();
        let path = dir.path("db");
        let writer = gathering_table(&path, "");
        for round in 0..5 {
            for i in 0..100 {
                insert(&writer, &format!("{round} {i:0>300}"));
            }
            // The next commit starts the WAL over from its header.
            let (busy, _, _): (i64, i64, i64) = writer
                .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .unwrap();
            assert_eq!(busy, 0);
        }
        writer
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        assert_eq!(std::fs::metadata(dir.path("db-wal")).unwrap().len(), 0);
        insert(&writer, "last");
        assert_recovers(&dir, 501);
    }

    /// The frames of the WAL file (its header's page size), up to the last
    /// commit frame, and the length of the file.
    fn wal_frames_end(dir: &Dir) -> (usize, usize) {
        let wal = std::fs::read(dir.path("db-wal")).unwrap();
        let page = u32::from_be_bytes(wal[8..12].try_into().unwrap()) as usize;
        let salts = &wal[16..24];
        let frame = FRAME_HEADER + page;
        let mut end = 32;
        let mut at = 32;
        while at + frame <= wal.len() && &wal[at + 8..at + 16] == salts {
            if wal[at + 4..at + 8] != [0, 0, 0, 0] {
                end = at + frame;
            }
            at += frame;
        }
        (end, wal.len())
    }

    #[test]
    fn a_growing_wal_is_extended_with_zeros_that_recovery_stops_at() {
        let dir = Dir::new();
        let path = dir.path("db");
        let writer = gathering_table(&path, "");
        for i in 0..300 {
            insert(&writer, &format!("{i:0>500}"));
            let (end, len) = wal_frames_end(&dir);
            assert!(len > end, "the file ends at its last frame: {len}");
            assert!(len <= end + EXTEND_BY, "{len} past {end}");
        }
        let (end, len) = wal_frames_end(&dir);
        let wal = std::fs::read(dir.path("db-wal")).unwrap();
        assert!(wal[end..len].iter().all(|&b| b == 0));
        assert_recovers(&dir, 300);
    }

    #[test]
    fn writers_sharing_a_wal_keep_each_others_commits() {
        let dir = Dir::new();
        let path = dir.path("db");
        let first = gathering_table(&path, "");
        let vfs = name().unwrap();
        let second = Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), vfs).unwrap();
        let plain = Connection::open(&path).unwrap();
        // Each extends the file past what the others know of it, and the
        // WAL starts over twice while they do.
        for round in 0..3 {
            for i in 0..150 {
                let conn = [&first, &second, &plain][i % 3];
                insert(conn, &format!("{round} {i:0>700}"));
            }
            if round < 2 {
                plain
                    .query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
                    .unwrap();
            }
        }
        assert_eq!(count(&plain), 450);
        assert_recovers(&dir, 450);
    }

    #[test]
    fn pages_written_past_the_gathering_limit_commit_intact() {
        let dir = Dir::new();
        let path = dir.path("db");
        // 64 KiB pages go to the file one by one, spilled and rewritten.
        let writer = gathering_table(&path, "PRAGMA page_size=65536; PRAGMA cache_size=2;");
        spilled_transaction(&writer, 60, 30000);
        insert(&writer, "after");
        assert_recovers(&dir, 61);
    }

    #[test]
    fn full_sync_commits_are_complete_too() {
        let dir = Dir::new();
        let path = dir.path("db");
        let writer = gathering_table(&path, "PRAGMA synchronous=FULL;");
        for i in 0..50 {
            insert(&writer, &format!("{i:0>2000}"));
        }
        assert_recovers(&dir, 50);
    }
}
