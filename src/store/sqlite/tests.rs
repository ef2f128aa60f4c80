//! Tests of the SQLite store through its public operations: schema
//! upgrades as opening a store performs them, and chat rows.

mod durable_schema {
    use crate::store::sqlite::open::open_connection;
    use rusqlite::Connection;

    fn runs_indexes(conn: &Connection) -> Vec<String> {
        let mut st = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs' \
                 AND sql IS NOT NULL ORDER BY name",
            )
            .unwrap();
        let names = st.query_map([], |r| r.get(0)).unwrap();
        names.collect::<rusqlite::Result<_>>().unwrap()
    }

    fn plan(conn: &Connection, sql: &str) -> Vec<String> {
        let mut st = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let nulls = std::iter::repeat_n(rusqlite::types::Null, st.parameter_count());
        let rows = st
            .query_map(rusqlite::params_from_iter(nulls), |r| r.get(3))
            .unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    #[test]
    fn version_8_replaces_the_two_recovery_indexes_with_one() {
        let dir = std::env::temp_dir().join(format!("composeai-active-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("runs.db").to_string_lossy().into_owned();
        let _ = std::fs::remove_file(&path);
        let conn = open_connection(&path, false).unwrap();
        assert_eq!(
            runs_indexes(&conn),
            ["runs_active", "runs_by_created", "runs_by_deadline"]
        );
        // Both halves of the recovery query read the runs it may return
        // through the partial index, never the whole table.
        let steps = plan(&conn, crate::store::sqlite::durable::RECOVERABLE_RUNS);
        let scans: Vec<_> = steps.iter().filter(|s| s.contains("runs")).collect();
        assert_eq!(scans.len(), 2, "{steps:?}");
        assert!(
            scans.iter().all(|s| s.contains("USING INDEX runs_active")),
            "{steps:?}"
        );
        // A version-5 store (the two older indexes) is brought to version 8.
        conn.execute_batch(
            "DROP INDEX runs_active; \
             CREATE INDEX runs_running ON runs(rid) WHERE status = 'running'; \
             CREATE INDEX runs_leased ON runs(rid) WHERE lease_owner IS NOT NULL; \
             PRAGMA user_version = 5;",
        )
        .unwrap();
        drop(conn);
        let conn = open_connection(&path, false).unwrap();
        assert_eq!(
            runs_indexes(&conn),
            ["runs_active", "runs_by_created", "runs_by_deadline"]
        );
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, crate::store::sqlite::schema::SCHEMA_VERSION);
        drop(conn);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

mod migrate {
    use crate::owner::owner_id;
    use crate::store::sqlite::open::open_connection;
    use crate::store::sqlite::query::trace_spans;
    use crate::store::sqlite::schema::SCHEMA_VERSION;
    use crate::store::sqlite::store::SqliteStore;
    use crate::store::takeover::Takeover;
    use crate::store::{NewRun, SpanRecord, SpanRow, Store};
    use rusqlite::Connection;
    use std::sync::Arc;

    use crate::test_dir::Dir;

    fn new_run(run_id: &str) -> NewRun {
        NewRun {
            run_id: run_id.into(),
            trace_id: format!("T{run_id}"),
            kind: "flow".into(),
            name: "f".into(),
            ..NewRun::default()
        }
    }

    fn span(id: &str, key: &str) -> SpanRow {
        SpanRow {
            span_id: id.into(),
            kind: "task".into(),
            name: "t".into(),
            status: "ok".into(),
            step_key: Some(key.into()),
            ..Default::default()
        }
    }

    fn user_version(path: &str) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_version_9_store_is_brought_up_and_its_traces_rows_kept() {
        let dir = Dir::new();
        let path = dir.db();
        let rid = SqliteStore::open(&path)
            .unwrap()
            .create_run(&new_run("B"), owner_id(), 0.0)
            .unwrap()
            .rid;
        // What version 9 wrote for B's first span.
        Connection::open(&path)
            .unwrap()
            .execute_batch(&format!(
                "INSERT INTO traces(trace_id) VALUES('TB'); \
                 INSERT INTO spans(tid, rid, span_id, kind, name, started_at, status, flags) \
                 VALUES((SELECT tid FROM traces WHERE trace_id = 'TB'), {rid}, 'B1', 'task', \
                 't', 0.0, 'ok', 0); \
                 PRAGMA user_version = 9;"
            ))
            .unwrap();

        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        assert_eq!(user_version(&path), SCHEMA_VERSION);
        // B, resumed, keeps its trace's row; a new run owns its trace.
        let commit = |rid: i64, trace: &str, key: &str, id: &str| {
            let record = SpanRecord::of_step(trace, rid, span(id, key), Some("1"));
            store
                .commit_step(rid, key, "1", None, Some(record))
                .unwrap();
        };
        let live = |_: &str, _: f64| false;
        store
            .acquire("B", owner_id(), 1e12, &live, Takeover::Manual)
            .unwrap();
        commit(rid, "TB", "t#2", "B2");
        let c_rid = store
            .create_run(&new_run("C"), owner_id(), 1e12)
            .unwrap()
            .rid;
        commit(c_rid, "TC", "t#1", "C1");
        store.flush().unwrap();

        let conn = open_connection(&path, false).unwrap();
        let tids = |rid: i64| -> Vec<i64> {
            conn.prepare("SELECT tid FROM spans WHERE rid = ?1 ORDER BY sid")
                .unwrap()
                .query_map([rid], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        };
        let tb: i64 = conn
            .query_row("SELECT tid FROM traces WHERE trace_id = 'TB'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(tids(rid), [tb, tb]);
        assert_eq!(tids(c_rid), [-c_rid]);
        let ids = |rid: i64, trace: &str| -> Vec<String> {
            trace_spans(&conn, rid, trace)
                .unwrap()
                .into_iter()
                .map(|s| s.span_id)
                .collect()
        };
        assert_eq!(ids(rid, "TB"), ["B1", "B2"]);
        assert_eq!(ids(c_rid, "TC"), ["C1"]);
    }

    #[test]
    fn a_store_of_a_newer_version_is_refused_and_left_alone() {
        let dir = Dir::new();
        let path = dir.db();
        drop(SqliteStore::open(&path).unwrap());
        let newer = SCHEMA_VERSION + 1;
        Connection::open(&path)
            .unwrap()
            .execute_batch(&format!("PRAGMA user_version = {newer}"))
            .unwrap();
        let err = SqliteStore::open(&path).err().unwrap().to_string();
        assert!(
            err.contains(&format!("schema version {newer}, newer")),
            "{err}"
        );
        assert_eq!(user_version(&path), newer);
    }
}

mod chat {
    use crate::store::sqlite::store::SqliteStore;
    use crate::store::ChatRow;
    use crate::store::Store;

    #[test]
    fn upsert_keeps_created_at_and_replaces_the_rest() {
        let dir = std::env::temp_dir().join(format!("composeai-chat-{}", crate::ids::new_ulid()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("runs.db").to_string_lossy().into_owned();
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.load_chat("nope").unwrap(), None);
        let mut row = ChatRow {
            chat_id: "c1".into(),
            agent_name: "helper".into(),
            system: Some("be brief".into()),
            model: None,
            messages_json: "[1]".into(),
            created_at: 10.0,
            updated_at: 0.0,
        };
        store.save_chat(&row).unwrap();
        let first = store.load_chat("c1").unwrap().unwrap();
        assert_eq!(first.messages_json, "[1]");
        assert!(first.updated_at >= first.created_at);
        row.messages_json = "[1,2]".into();
        row.created_at = 99.0;
        row.model = Some("fake/m".into());
        store.save_chat(&row).unwrap();
        let second = store.load_chat("c1").unwrap().unwrap();
        assert_eq!(second.created_at, 10.0);
        assert_eq!(second.messages_json, "[1,2]");
        assert_eq!(second.model.as_deref(), Some("fake/m"));
        assert_eq!(second.system.as_deref(), Some("be brief"));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

mod published {
    use crate::store::sqlite::open::open_connection;

    /// A prune reads the runs it may delete through the creation-time index
    /// and the journal's fork rows through their partial index: never a
    /// scan of the runs or of the journal.
    #[test]
    fn prune_selects_through_indexes() {
        let dir = std::env::temp_dir().join(format!("composeai-prune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("runs.db").to_string_lossy().into_owned();
        let _ = std::fs::remove_file(&path);
        let conn = open_connection(&path, false).unwrap();
        let sql = format!(
            "EXPLAIN QUERY PLAN {}",
            crate::store::sqlite::published::PRUNE_SELECT
        );
        let mut st = conn.prepare(&sql).unwrap();
        let steps: Vec<String> = st
            .query_map(
                rusqlite::params![0.0, "[\"completed\"]", None::<String>, None::<String>, 10],
                |r| r.get(3),
            )
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            steps
                .iter()
                .any(|s| s.contains("USING INDEX runs_by_created")),
            "{steps:?}"
        );
        assert!(
            steps
                .iter()
                .any(|s| s.contains("USING INDEX journal_forks")),
            "{steps:?}"
        );
        assert!(
            !steps
                .iter()
                .any(|s| s == "SCAN r" || s == "SCAN f" || s == "SCAN a"),
            "{steps:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
