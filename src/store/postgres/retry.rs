//! The one retry layer around the server connection (STORE-40, STORE-41).
//!
//! Every store operation runs through `retry` (or `retry_blocking` for the
//! paths that call back into the engine mid-transaction): a try that fails
//! because the server cannot be reached (refused, reset, terminated, shut
//! down, or silent past `COMPOSE_STORE_TIMEOUT`) is tried again on a fresh
//! connection, at once the first time (a pooled connection that died while
//! idle), then after 100 ms doubling to 5 s, with jitter, until
//! `COMPOSE_STORE_OUTAGE_SECONDS` have passed since the first failure. No
//! caller above the trait learns about reconnects. Every operation is safe
//! to repeat because each write is fenced and keyed (see the callers'
//! notes): a write whose commit reply was lost is found on the retry, not
//! made twice.

use crate::error::{CoreError, CoreResult};
use crate::outage;
use crate::runtime::block_on;
use crate::store::postgres::inner::PgInner;
use rand::Rng;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

impl PgInner {
    /// Runs `op` on the shared runtime until it succeeds, fails for another
    /// reason than the server's reachability, or the outage outlasts
    /// `COMPOSE_STORE_OUTAGE_SECONDS`. `op` is told whether it is a retry
    /// (its earlier try may have committed before the connection dropped).
    pub(crate) fn retry<T>(&self, op: impl AsyncFnMut(bool) -> CoreResult<T>) -> CoreResult<T> {
        block_on(self.retry_async(op))
    }

    /// `retry` for a caller already on the runtime.
    pub(crate) async fn retry_async<T>(
        &self,
        mut op: impl AsyncFnMut(bool) -> CoreResult<T>,
    ) -> CoreResult<T> {
        let mut backoff = Backoff::new(self);
        loop {
            match self.bounded(op(backoff.retrying())).await {
                Err(CoreError::Unavailable(why)) => {
                    let pause = backoff.next(why)?;
                    tokio::time::sleep(pause).await;
                }
                other => {
                    outage::reachable();
                    return other;
                }
            }
        }
    }

    /// `retry_async` of an operation given as a function of the retry flag
    /// returning a future (whose `Send`-ness then carries over to the
    /// caller's, for work spawned on the runtime).
    pub(crate) async fn retry_with<T, F, Fut>(&self, mut op: F) -> CoreResult<T>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = CoreResult<T>>,
    {
        let mut backoff = Backoff::new(self);
        loop {
            match self.bounded(op(backoff.retrying())).await {
                Err(CoreError::Unavailable(why)) => {
                    let pause = backoff.next(why)?;
                    tokio::time::sleep(pause).await;
                }
                other => {
                    outage::reachable();
                    return other;
                }
            }
        }
    }

    /// `retry` for an operation that blocks on the runtime itself (a graph
    /// transaction that calls back into the engine between statements).
    pub(crate) fn retry_blocking<T>(
        &self,
        mut op: impl FnMut(bool) -> CoreResult<T>,
    ) -> CoreResult<T> {
        let mut backoff = Backoff::new(self);
        loop {
            match op(backoff.retrying()) {
                Err(CoreError::Unavailable(why)) => {
                    let pause = backoff.next(why)?;
                    std::thread::sleep(pause);
                }
                other => {
                    outage::reachable();
                    return other;
                }
            }
        }
    }

    /// `fut` within one try's time: a server that accepted the connection
    /// but does not answer becomes an outage, never a hang.
    pub(crate) async fn bounded<T>(
        &self,
        fut: impl Future<Output = CoreResult<T>>,
    ) -> CoreResult<T> {
        match tokio::time::timeout(self.limits.timeout, fut).await {
            Ok(r) => r,
            Err(_) => {
                self.forget_connections();
                Err(self.silent())
            }
        }
    }

    /// `block_on(bounded(fut))`, for one statement of a blocking path.
    pub(crate) fn bounded_blocking<T>(
        &self,
        fut: impl Future<Output = CoreResult<T>>,
    ) -> CoreResult<T> {
        block_on(self.bounded(fut))
    }

    /// The error of a try the server left unanswered.
    pub(super) fn silent(&self) -> CoreError {
        CoreError::Unavailable(format!(
            "composeai store '{}': cannot reach the server (no answer within {}s, \
             COMPOSE_STORE_TIMEOUT)",
            self.url.redacted,
            fmt_secs(self.limits.timeout)
        ))
    }

    /// Drops the idle connections, pooled and driven: after a silent or lost
    /// server they are most likely dead too, and a try on one would wait out
    /// another timeout.
    pub(super) fn forget_connections(&self) {
        self.pool.retain(|_, _| false);
        let dropped = std::mem::take(&mut *self.driven.idle.lock());
        self.driven.open.fetch_sub(dropped.len(), Ordering::SeqCst);
    }
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}

/// The pauses between tries of one operation.
struct Backoff<'a> {
    store: &'a PgInner,
    tries: u32,
    first: Option<Instant>,
}

impl<'a> Backoff<'a> {
    fn new(store: &'a PgInner) -> Backoff<'a> {
        Backoff {
            store,
            tries: 0,
            first: None,
        }
    }

    fn retrying(&self) -> bool {
        self.tries > 0
    }

    /// The pause before the next try after a failure (`why`), or the error
    /// to raise once the outage outlasted the limit.
    fn next(&mut self, why: String) -> CoreResult<Duration> {
        let limit = self.store.limits.outage;
        if limit.is_zero() {
            return Err(CoreError::Unavailable(why));
        }
        let first = *self.first.get_or_insert_with(Instant::now);
        self.tries += 1;
        self.store.forget_connections();
        if self.tries == 1 {
            // The connection may only have died while idle: a fresh one now.
            return Ok(Duration::ZERO);
        }
        outage::unreachable(&self.store.url.redacted, &why);
        let left = limit.saturating_sub(first.elapsed());
        if left.is_zero() {
            return Err(CoreError::Unavailable(format!(
                "{why}; still unreachable after {}s of retrying (COMPOSE_STORE_OUTAGE_SECONDS) \
                 -- nothing was lost: resume the run once the server is back",
                fmt_secs(limit)
            )));
        }
        let doubled = FIRST_PAUSE.saturating_mul(1 << (self.tries - 2).min(16));
        let pause = doubled.min(LONGEST_PAUSE);
        let jittered = pause.mul_f64(rand::thread_rng().gen_range(0.5..=1.0));
        Ok(jittered.min(left))
    }
}
