//! Chat rows (CHAT-4, CHAT-7): one persistent conversation per chat id.
//!
//! A row is written only after a completed send; `created_at` is the chat's
//! own (kept on every later upsert), `updated_at` is stamped here.

use crate::store::ChatRow;
use crate::time::now;
use rusqlite::{params, Connection, OptionalExtension};

/// Inserts or replaces the chat's row; the first `created_at` stays.
pub fn upsert(conn: &Connection, chat: &ChatRow) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO chats(chat_id, agent_name, system, model, messages_json, created_at, \
         updated_at) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7) \
         ON CONFLICT(chat_id) DO UPDATE SET agent_name = excluded.agent_name, \
         system = excluded.system, model = excluded.model, \
         messages_json = excluded.messages_json, updated_at = excluded.updated_at",
    )?
    .execute(params![
        chat.chat_id,
        chat.agent_name,
        chat.system,
        chat.model,
        chat.messages_json,
        chat.created_at,
        now(),
    ])
    .map(|_| ())
}

pub fn get(conn: &Connection, chat_id: &str) -> rusqlite::Result<Option<ChatRow>> {
    conn.prepare_cached(
        "SELECT chat_id, agent_name, system, model, messages_json, created_at, updated_at \
         FROM chats WHERE chat_id = ?1",
    )?
    .query_row([chat_id], |r| {
        Ok(ChatRow {
            chat_id: r.get(0)?,
            agent_name: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
            system: r.get(2)?,
            model: r.get(3)?,
            messages_json: r
                .get::<_, Option<String>>(4)?
                .unwrap_or_else(|| "[]".into()),
            created_at: r.get::<_, Option<f64>>(5)?.unwrap_or(0.0),
            updated_at: r.get::<_, Option<f64>>(6)?.unwrap_or(0.0),
        })
    })
    .optional()
}
