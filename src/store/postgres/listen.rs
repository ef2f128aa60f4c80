//! Wake-ups (STORE-22). On PostgreSQL one dedicated connection per store
//! and process `LISTEN`s on `<schema>.wake` (the triggers of the queue
//! schema notify it) and pokes the engine clock, which wakes every waiting
//! worker loop and blocked run of the process at once; they read the store
//! again. A notification is a hint: waits still poll, at most every
//! `PG_POLL`, so a lost one costs latency, never correctness. SQLite has no
//! notifications: its waits poll every `durable::POLL`.

use crate::clock;
use crate::runtime::runtime;
use crate::store::postgres::inner::{PgInner, PgStore};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// The polling fallback of a wait on PostgreSQL.
pub const PG_POLL: Duration = Duration::from_secs(1);

/// How long the listener waits before reconnecting after losing its
/// connection.
const RECONNECT: Duration = Duration::from_millis(500);

/// Listeners started by this process, by store URL and schema.
fn started() -> &'static Mutex<HashSet<String>> {
    static STARTED: std::sync::OnceLock<Mutex<HashSet<String>>> = std::sync::OnceLock::new();
    STARTED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// The channel a schema's triggers notify.
pub fn channel(schema: &str) -> String {
    format!("{schema}.wake")
}

/// Starts the store's listener unless this process already has one.
pub fn ensure_listener(store: &PgStore) {
    let key = format!("{}#{}", crate::store::Store::path(store), store.schema());
    if !started().lock().insert(key) {
        return;
    }
    runtime().spawn(listen(store.shared()));
}

async fn listen(inner: Arc<PgInner>) {
    let sql = format!("LISTEN \"{}\"", channel(inner.schema()));
    loop {
        if let Ok((client, mut messages)) = inner.dedicated().await {
            if client.batch_execute(&sql).await.is_ok() {
                // Whatever was notified while not listening is looked for now.
                clock::poke();
                while let Some(m) = messages.recv().await {
                    if matches!(m, tokio_postgres::AsyncMessage::Notification(_)) {
                        clock::poke();
                    }
                }
            }
        }
        tokio::time::sleep(RECONNECT).await;
    }
}
