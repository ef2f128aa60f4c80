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
//! The thread and its connection start at the first request, so a process
//! that commits less than `LIMIT` frames (a CLI command, a resume in a fresh
//! process) opens one connection, not two. Should either fail to start, the
//! writer connection checkpoints itself at each request instead, as SQLite's
//! automatic checkpoint would.
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
/// each commit: 32 MiB of a new store's 2 KiB pages. Each time it does, a
/// writer that never pauses stalls for the copy of what the thread has not
/// copied yet and two fsyncs (about 5 ms here), so this sets how rarely.
const INLINE: c_int = 16 * LIMIT;
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
    /// The thread was started (it may since have failed).
    started: bool,
    /// The thread or its connection could not start: the writer
    /// checkpoints at each request itself.
    inline: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// The database the thread opens its connection to.
    path: String,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The running checkpoint thread of a store. Dropping it stops and joins the
/// thread; it must be dropped after the writer connection it was started for
/// (whose commits call into it).
pub struct Checkpointer {
    shared: Arc<Shared>,
}

impl Checkpointer {
    /// Takes over the checkpoints of `writer`, a connection to the
    /// database at `path`: its WAL growth is reported here, which turns
    /// SQLite's automatic checkpoint off on that connection only. The
    /// thread starts at the first request.
    pub fn start(path: &str, writer: &Connection) -> Checkpointer {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            path: path.to_string(),
            thread: Mutex::new(None),
        });
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
        Checkpointer { shared }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.shared.thread.lock().take() {
            // A checkpoint under way finishes first (a few ms); the thread's
            // connection closes with it.
            let _ = thread.join();
        }
    }
}

/// The checkpoint thread's connection to `path`, its WAL open.
fn open_connection(path: &str) -> Option<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).ok()?;
    // Reading the database opens its WAL on this connection; a checkpoint
    // of a connection that has not is a no-op.
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .ok()?;
    mode.eq_ignore_ascii_case("wal").then_some(conn)
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
    ///
    /// `this` is the pointer `start` registered, to a live `Arc<Shared>`.
    fn committed(this: *const Shared, db: *mut ffi::sqlite3, name: *const c_char, frames: c_int) {
        // SAFETY: `Checkpointer` keeps the Arc alive while its writer
        // connection (the caller) is open.
        let shared = unsafe { &*this };
        let inline = {
            let mut s = shared.state.lock();
            if frames < s.frames {
                s.asked_at = 0;
            }
            s.frames = frames;
            // A checkpoint that could not copy everything (a reader still
            // uses old frames) is asked for again after as many new frames.
            let asked = frames - s.asked_at >= LIMIT;
            if asked {
                s.asked_at = frames;
                s.requested = true;
                if !s.started {
                    s.started = true;
                    // SAFETY: as above; the thread holds its own count.
                    let mine = unsafe {
                        Arc::increment_strong_count(this);
                        Arc::from_raw(this)
                    };
                    match std::thread::Builder::new()
                        .name("composeai-ckpt".into())
                        .spawn(move || mine.run())
                    {
                        Ok(thread) => *shared.thread.lock() = Some(thread),
                        Err(_) => s.inline = true,
                    }
                } else {
                    shared.wake.notify_one();
                }
            }
            (asked && s.inline) || frames >= INLINE
        };
        if inline {
            checkpoint(db, name);
        }
    }

    fn run(&self) {
        let Some(conn) = open_connection(&self.path) else {
            self.state.lock().inline = true;
            return;
        };
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
    Shared::committed(context as *const Shared, db, name, frames);
    ffi::SQLITE_OK
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::open::open_connection;

    /// Commits of one 3,000-byte row each until `until` holds (at most
    /// `max` commits); whether it did.
    fn commit_until(writer: &Connection, max: usize, mut until: impl FnMut() -> bool) -> bool {
        (0..max).any(|_| {
            writer
                .execute("INSERT INTO t VALUES(zeroblob(3000))", [])
                .unwrap();
            until()
        })
    }

    #[test]
    fn the_wal_starts_over_soon_after_a_reader_that_held_it_back_lets_go() {
        let dir = crate::test_dir::Dir::new();
        let path = dir.db();
        let writer = open_connection(&path, false).unwrap();
        let ckpt = Checkpointer::start(&path, &writer);
        writer.execute_batch("CREATE TABLE t(x BLOB)").unwrap();
        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        let frames = || ckpt.shared.state.lock().frames;
        // The reader's snapshot keeps every checkpoint from copying the WAL.
        commit_until(&writer, usize::MAX, || frames() >= INLINE + 10);
        reader.execute_batch("COMMIT").unwrap();
        let grown = frames();
        // Not a thousand frames later: the next commits start it over.
        let started_over = commit_until(&writer, 100, || frames() < grown);
        // The commits call into the checkpointer: the writer goes first.
        drop(writer);
        drop(ckpt);
        drop(reader);
        assert!(started_over, "the WAL still grows past {grown} frames");
    }

    #[test]
    fn the_thread_starts_at_the_first_request_and_then_starts_the_wal_over() {
        let dir = crate::test_dir::Dir::new();
        let path = dir.db();
        let writer = open_connection(&path, false).unwrap();
        let ckpt = Checkpointer::start(&path, &writer);
        writer.execute_batch("CREATE TABLE t(x BLOB)").unwrap();
        let frames = || ckpt.shared.state.lock().frames;
        let started = || ckpt.shared.thread.lock().is_some();
        assert!(commit_until(&writer, 1000, || frames() >= LIMIT - 10));
        assert!(!started(), "started before the first request");
        assert!(commit_until(&writer, 100, started));
        let peak = frames();
        // The thread copies the WAL; a later commit starts it over.
        let started_over = commit_until(&writer, 20_000, || frames() < peak);
        assert!(!ckpt.shared.state.lock().inline);
        drop(writer);
        drop(ckpt);
        assert!(started_over, "the WAL still grows past {peak} frames");
    }

    #[test]
    fn without_its_connection_the_writer_checkpoints_itself() {
        let dir = crate::test_dir::Dir::new();
        let path = dir.db();
        let writer = open_connection(&path, false).unwrap();
        // A path the thread cannot open (its own connection never creates).
        let ckpt = Checkpointer::start(&dir.path("missing/x.db"), &writer);
        writer.execute_batch("CREATE TABLE t(x BLOB)").unwrap();
        let frames = || ckpt.shared.state.lock().frames;
        let inline = || ckpt.shared.state.lock().inline;
        // The thread fails at the first request, then every request
        // checkpoints on the writer: the WAL starts over well before INLINE.
        let gave_up = commit_until(&writer, 20_000, || {
            std::thread::sleep(Duration::from_micros(50));
            inline()
        });
        // Requests come every LIMIT frames: the one after the failure copies
        // the WAL and the next commit starts it over.
        let mut most = 0;
        let started_over = commit_until(&writer, 3 * LIMIT as usize, || {
            let now = frames();
            let over = now < most;
            most = most.max(now);
            over
        });
        drop(writer);
        drop(ckpt);
        assert!(gave_up, "the thread did not report its failure");
        assert!(
            started_over && most < 3 * LIMIT,
            "the WAL grew to {most} frames"
        );
    }
}
