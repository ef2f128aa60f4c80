//! PostgreSQL implementation of `Store` (STORE-1 … STORE-3, STORE-11,
//! STORE-30): a pooled `tokio-postgres` driver on the core's shared runtime.
//!
//! Every write of an attempt is fenced in its own statement on the attempt
//! still owning the run: the statement reads the run row `FOR SHARE`, so a
//! takeover (which updates that row) waits for it and then sees its write,
//! and a write issued after a takeover stores nothing. A journaled step is
//! one statement, hence one round trip; spans queued before it travel in the
//! same pipelined batch.

mod answer;
mod batch;
mod driven;
mod ext;
mod inner;
pub mod listen;
mod published;
pub mod query;
pub mod queue;
mod reachability;
mod retry;
mod schedule;
mod schema;
mod sql;
mod state;
mod store;
mod tls;
mod upgrade;

pub use inner::{PgInner, PgStore};
pub use schema::PG_SCHEMA_VERSION;
