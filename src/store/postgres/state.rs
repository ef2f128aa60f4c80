//! What a store keeps for its write paths: the driven connections of the
//! blocking step commits and batch durability's waiting journal rows.

use crate::store::slot::Slot;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::task::Poll;
use tokio_postgres::{Client, Statement};

pub(super) type Driver = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

/// A connection with its own runtime, and the statements prepared on it.
pub(super) struct Driven {
    pub(super) client: Client,
    /// The connection's I/O; `None` once it ended (the client is then closed).
    pub(super) conn: Option<Driver>,
    /// The step statement without and with its span row (`step_sql`).
    pub(super) steps: [Option<Statement>; 2],
    pub(super) spans: Option<Statement>,
    /// Last, so the connection's socket is gone before its runtime.
    pub(super) rt: OwnRuntime,
}

/// A connection's runtime. Dropped without blocking: the last handle on the
/// store may go on the shared runtime (its background span flush).
pub(super) struct OwnRuntime(pub(super) Option<tokio::runtime::Runtime>);

impl std::ops::Deref for OwnRuntime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0
            .as_ref()
            .expect("a connection's runtime lives as long as it")
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The idle driven connections, and how many are open.
#[derive(Default)]
pub(super) struct DrivenPool {
    pub(super) idle: Mutex<Vec<Driven>>,
    pub(super) open: AtomicUsize,
}

/// Runs `fut` on the calling thread, driving the connection's I/O with it.
pub(super) fn drive<T>(
    rt: &tokio::runtime::Runtime,
    conn: &mut Option<Driver>,
    fut: impl Future<Output = T>,
) -> T {
    let mut fut = pin!(fut);
    rt.block_on(std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(v);
        }
        if let Some(c) = conn {
            if c.as_mut().poll(cx).is_ready() {
                // Dropping the ended connection fails its pending requests,
                // so `fut` finishes with the driver's error when polled again.
                *conn = None;
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    }))
}

pub(super) struct Waiting {
    pub(super) rid: i64,
    pub(super) key: String,
    pub(super) value: String,
    pub(super) ident: Option<String>,
    pub(super) slot: Arc<Slot>,
}

/// The journal rows waiting for the group-commit.
#[derive(Default)]
pub struct Batch {
    pub(super) rows: Mutex<Vec<Waiting>>,
    pub(super) armed: AtomicBool,
    /// Held from taking the rows until they are committed, so a `flush`
    /// meanwhile waits for them (and rows stay in order).
    pub(super) writing: tokio::sync::Mutex<()>,
}
