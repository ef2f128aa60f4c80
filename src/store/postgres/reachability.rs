//! What the retry layer (`retry.rs`) needs to know without the pool: how
//! long it retries and how long one try may take, and which driver errors
//! mean the server cannot be reached. Kept apart so the connection code
//! and the statements can ask it without importing the layer itself.

use crate::error::CoreResult;
use crate::outage;
use std::time::Duration;

/// How long the layer retries, and how long one try may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub outage: Duration,
    pub timeout: Duration,
}

impl Limits {
    /// `COMPOSE_STORE_OUTAGE_SECONDS` and `COMPOSE_STORE_TIMEOUT`, read when
    /// the store is opened.
    pub fn from_env() -> CoreResult<Limits> {
        Ok(Limits {
            outage: Duration::from_secs_f64(outage::outage_seconds()?),
            timeout: outage::timeout()?,
        })
    }
}

/// Whether a driver error means the server cannot be reached (the
/// operation may succeed on a fresh connection later), rather than that
/// the operation itself is wrong.
pub(super) fn is_unreachable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let c = code.code();
        // Class 08: connection exceptions. 57P01..03: the server is shutting
        // down, crashed, or not yet accepting connections. 57014: a
        // statement timeout (a server too slow to answer is an outage too).
        // 53300: too many connections (a restarting server's burst).
        return c.starts_with("08") || c.starts_with("57P") || c == "57014" || c == "53300";
    }
    // No server error: the socket failed (refused, reset, timed out). A
    // TLS handshake that refused the server's certificate fails as
    // `InvalidData`: that is the URL's fault, not an outage.
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            return matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::TimedOut
                    | K::UnexpectedEof
                    | K::AddrNotAvailable
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::NetworkDown
                    | K::Interrupted
            );
        }
        src = inner.source();
    }
    let text = e.to_string();
    text.contains("timeout") || text.contains("error communicating with the server")
}
