//! SQLite implementation of `Store`: one WAL database per state directory.
//!
//! Writes go through a leader-based group commit. A caller enqueues its
//! operation, then takes the connection lock; if a previous lock holder
//! already committed the operation it just reads its result, otherwise it
//! commits everything queued in one transaction. Sequential callers thus
//! commit on their own thread with no hand-off, and concurrent callers share
//! commits.

pub mod answer;
pub mod batched;
pub mod chat;
mod checkpointer;
pub mod durable;
pub mod durable_schema;
pub mod graph;
pub mod graph_schema;
mod migrate;
mod multirow;
mod open;
pub mod published;
pub mod published_schema;
pub mod query;
pub mod queue;
pub mod queue_schema;
pub mod replayed;
pub mod rows;
mod schedule;
pub mod schema;
pub mod starts_schema;
pub mod statements;
pub mod step_spans;
mod store;
pub mod upgrade;
pub mod wal_vfs;
pub mod write_tx;
mod writer;

#[cfg(test)]
mod tests;

pub use open::{migrate_file, open_connection};
pub use rows::{
    read_pending, read_run_row, JOURNAL_INSERT, JOURNAL_STEP_INSERT, PLAIN_SPAN_INSERT,
    QUEUED_RUN_INSERT, SPAN_INSERT,
};
pub use schema::{PAGE_SIZE, SCHEMA, SCHEMA_VERSION};
pub use store::SqliteStore;
#[cfg(test)]
pub(crate) use writer::MAX_BACKLOG;
pub use writer::{Inner, BATCH_LATENCY};
