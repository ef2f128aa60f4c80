//! WAL checkpoints on a thread of their own, one per store.
//!
//! SQLite's automatic checkpoint runs inside the commit that grows the WAL
//! past 1,000 frames, so that commit waits for the copy into the database
//! file and its fsyncs. A store's checkpointer replaces it on the writer
//! connection: every commit reports the WAL's length, and a commit that
//! crosses the next multiple of `LIMIT` wakes a thread that runs a PASSIVE
//! checkpoint on its own connection (it never blocks writers). Once all
//! frames are copied, the next commit starts the WAL over from its
//! beginning, as after an automatic checkpoint. Commits themselves are
//! unchanged (same WAL, same `synchronous`); only who copies committed frames
//! into the database moves.
//!
//! A writer that never pauses leaves the thread no moment at which every
//! frame is copied, so the WAL could not start over; past `INLINE` frames
//! the writer connection checkpoints itself after every commit until the WAL
//! starts over, as SQLite would past its own limit (copying what the thread
//! has not copied yet). One try per `LIMIT` frames is not enough: a reader
//! that began before the commit keeps the try from copying every frame, or
//! the next commit from starting the WAL over, and a reader polling the
//! database can be there at every try while the WAL grows without bound.
//!
//! This relies on the core linking the process's one SQLite library (see
//! Cargo.toml): every connection in the process then sees the others' locks.

use parking_lot::{Condvar, Mutex};
use rusqlite::{ffi, Connection, OpenFlags};
use std::os::raw::{c_char, c_int, c_void};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// WAL frames between two checkpoint requests.
const LIMIT: c_int = 1000;
/// WAL length past which the writer connection checkpoints itself after
/// each commit.
const INLINE: c_int = 8 * LIMIT;
/// After a checkpoint that left frames behind (commits went on while it
/// copied), the next one runs this much later unless a request comes first.
const CATCH_UP: Duration = Duration::from_millis(100);

#[derive(Default)]
struct State {
    /// The WAL's length (frames) after the last commit; a shorter one means
    /// the WAL started over.
    frames: c_int,
    /// The WAL's length at the last request to the thread.
    asked_at: c_int,
    requested: bool,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The running checkpoint thread of a store. Dropping it stops and joins the
/// thread; it must be dropped after the writer connection it was started for
/// (whose commits call into it).
pub struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the checkpoint thread of the database at `path` and hands it
    /// `writer`'s WAL growth, which turns SQLite's automatic checkpoint off
    /// on that connection only. `None` when the thread or its connection
    /// cannot start: `writer` then keeps the automatic checkpoint.
    pub fn start(path: &str, writer: &Connection) -> Option<Checkpointer> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).ok()?;
        // Reading the database opens its WAL on this connection; a
        // checkpoint of a connection that has not is a no-op.
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .ok()?;
        if !mode.eq_ignore_ascii_case("wal") {
            return None;
        }
        let shared = Arc::new(Shared::default());
        let mine = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("composeai-ckpt".into())
            .spawn(move || mine.run(conn))
            .ok()?;
        // SAFETY: the handle is `writer`'s, open; the context pointer stays
        // valid while `writer` lives, since the returned value keeps the
        // Arc and is dropped after it.
        unsafe {
            ffi::sqlite3_wal_hook(
                writer.handle(),
                Some(on_commit),
                Arc::as_ptr(&shared) as *mut c_void,
            );
        }
        Some(Checkpointer {
            shared,
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // A checkpoint under way finishes first (a few ms); the thread's
            // connection closes with it.
            let _ = thread.join();
        }
    }
}

/// A PASSIVE checkpoint of `db`: `Some((frames in the WAL, frames copied))`,
/// `None` if another checkpoint was running or it failed (the frames stay
/// in the WAL, committed).
fn checkpoint(db: *mut ffi::sqlite3, name: *const c_char) -> Option<(c_int, c_int)> {
    let (mut log, mut copied) = (0, 0);
    // SAFETY: `db` is an open handle used by this thread only for the call.
    let rc = unsafe {
        ffi::sqlite3_wal_checkpoint_v2(
            db,
            name,
            ffi::SQLITE_CHECKPOINT_PASSIVE,
            &mut log,
            &mut copied,
        )
    };
    (rc == ffi::SQLITE_OK).then_some((log, copied))
}

impl Shared {
    /// Called by the writer connection after each commit, its write lock
    /// released: a request is a flag and a wake-up.
    fn committed(&self, db: *mut ffi::sqlite3, name: *const c_char, frames: c_int) {
        {
            let mut s = self.state.lock();
            if frames < s.frames {
                s.asked_at = 0;
            }
            s.frames = frames;
            // A checkpoint that could not copy everything (a reader still
            // uses old frames) is asked for again after as many new frames.
            if frames - s.asked_at >= LIMIT {
                s.asked_at = frames;
                s.requested = true;
                self.wake.notify_one();
            }
        }
        if frames >= INLINE {
            checkpoint(db, name);
        }
    }

    fn run(&self, conn: Connection) {
        let mut last = None;
        let mut behind = false;
        loop {
            {
                let mut s = self.state.lock();
                while !s.requested && !s.stop {
                    if !behind {
                        self.wake.wait(&mut s);
                    } else if self.wake.wait_for(&mut s, CATCH_UP).timed_out() {
                        break;
                    }
                }
                if s.stop {
                    return;
                }
                s.requested = false;
            }
            // SAFETY: the handle of this thread's own open connection.
            let done = checkpoint(unsafe { conn.handle() }, std::ptr::null());
            // Frames left behind (committed while it copied, or held by a
            // reader) are copied later, while that makes progress; a
            // checkpoint that changed nothing waits for the next request.
            let frames = self.state.lock().frames;
            behind = done.is_none_or(|(log, copied)| copied < log.max(frames)) && done != last;
            last = done;
        }
    }
}

extern "C" fn on_commit(
    context: *mut c_void,
    db: *mut ffi::sqlite3,
    name: *const c_char,
    frames: c_int,
) -> c_int {
    // SAFETY: `context` is the `Shared` that `start` registered, alive while
    // the connection calling this is.
    let shared = unsafe { &*(context as *const Shared) };
    shared.committed(db, name, frames);
    ffi::SQLITE_OK
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::open_connection;

    #[test]
    fn the_wal_starts_over_soon_after_a_reader_that_held_it_back_lets_go() {
        let dir = crate::test_dir::Dir::new();
        let path = dir.db();
        let writer = open_connection(&path, false).unwrap();
        let ckpt = Checkpointer::start(&path, &writer).unwrap();
        writer.execute_batch("CREATE TABLE t(x BLOB)").unwrap();
        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        let frames = || ckpt.shared.state.lock().frames;
        let commit = || {
            writer
                .execute("INSERT INTO t VALUES(zeroblob(3000))", [])
                .unwrap();
        };
        // The reader's snapshot keeps every checkpoint from copying the WAL.
        while frames() < INLINE + 10 {
            commit();
        }
        reader.execute_batch("COMMIT").unwrap();
        let grown = frames();
        // Not a thousand frames later: the next commits start it over.
        let started_over = (0..100).any(|_| {
            commit();
            frames() < grown
        });
        // The commits call into the checkpointer: the writer goes first.
        drop(writer);
        drop(ckpt);
        drop(reader);
        assert!(started_over, "the WAL still grows past {grown} frames");
    }
}
