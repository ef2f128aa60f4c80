//! The core's one shared tokio runtime. Server-backed stores run their I/O
//! on it; synchronous callers block on a future with the GIL released.

use std::future::Future;
use std::sync::OnceLock;

pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        // Two threads keep the driver's connections moving while callers
        // block; the work itself is waiting on the network.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("composeai-io")
            .enable_all()
            .build()
            .expect("composeai cannot start its I/O runtime")
    })
}

/// Runs `fut` to completion on the shared runtime from a synchronous caller.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    runtime().block_on(fut)
}
