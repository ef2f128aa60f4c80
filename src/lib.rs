//! composeai's engine core. Everything outside `py` is plain Rust, testable
//! with `cargo test`; `py` holds the Python bindings.

pub mod budget;
pub mod clock;
pub mod durable;
pub mod error;
pub mod graph;
pub mod ids;
pub mod journal;
pub mod lease;
pub mod outage;
pub mod owner;
pub mod py;
pub mod queue;
pub mod run;
pub mod runtime;
pub mod schedule;
pub mod span_tap;
pub mod sqlite_lib;
pub mod store;
#[cfg(test)]
pub(crate) mod test_dir;
pub mod time;
pub mod trace;
