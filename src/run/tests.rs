use super::*;
use crate::store::sqlite::SqliteStore;
use crate::store::SpanRow;

fn temp_store() -> (tempdir::Dir, Arc<dyn Store>) {
    let dir = tempdir::Dir::new();
    let store = SqliteStore::open(&dir.path("runs.db")).unwrap();
    (dir, Arc::new(store))
}

use crate::test_dir as tempdir;

fn new_run(name: &str) -> NewRun {
    NewRun {
        run_id: crate::ids::new_ulid(),
        trace_id: crate::ids::new_ulid(),
        kind: "flow".into(),
        name: name.into(),
        fingerprint: Some("f".into()),
        args_json: Some("{}".into()),
        budget_json: None,
        module: Some("app.flows".into()),
    }
}

fn span(key: &str, out: &str) -> SpanRow {
    SpanRow {
        span_id: crate::ids::new_ulid(),
        kind: "task".into(),
        name: "t".into(),
        status: "ok".into(),
        step_key: Some(key.into()),
        output_json: Some(out.into()),
        ..Default::default()
    }
}

fn completed() -> Settlement {
    Settlement {
        status: "completed".into(),
        output_json: Some("1".into()),
        ..Default::default()
    }
}

/// `(rid, status, lease_owner)` of `run_id`, read by another connection.
fn stored_row(path: &str, run_id: &str) -> Option<(i64, String, Option<String>)> {
    use rusqlite::OptionalExtension;
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT rid, status, lease_owner FROM runs WHERE run_id = ?1",
            [run_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .unwrap()
}

fn spans_of(path: &str, rid: i64) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("SELECT count(*) FROM spans WHERE rid = ?1", [rid], |r| {
            r.get(0)
        })
        .unwrap()
}

#[test]
fn a_queued_run_row_commits_with_the_settlement_and_its_spans_carry_its_rid() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let a = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
    a.queue_span(span("llm#1", "1"));
    a.settle(completed()).unwrap();
    let (rid, status, owner) = stored_row(&path, &a.run.run_id).unwrap();
    assert_eq!((status.as_str(), owner), ("completed", None));
    assert_eq!(spans_of(&path, rid), 1);
}

#[test]
fn the_writer_stores_a_queued_run_row_while_the_run_executes() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let a = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
    // Another process sees the row running and leased to this one,
    // with no commit by the attempt.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (rid, status, owner) = loop {
        if let Some(row) = stored_row(&path, &a.run.run_id) {
            break row;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the row was never written"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert_eq!(status, "running");
    assert_eq!(owner.as_deref(), Some(owner_id()));
    assert_eq!(a.rid().unwrap(), rid);
    a.queue_span(span("llm#1", "1"));
    a.settle(completed()).unwrap();
    assert_eq!(stored_row(&path, &a.run.run_id).unwrap().1, "completed");
    assert_eq!(spans_of(&path, rid), 1);
}

#[test]
fn a_journal_write_of_a_queued_run_stores_the_row_first_and_a_resume_sees_both() {
    let (_dir, store) = temp_store();
    let a = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
    a.commit("t#1", "7", Some(span("t#1", "7")), None).unwrap();
    let run_id = a.run.run_id.clone();
    drop(a); // a crash: never settled
    let b = Attempt::resume(store.clone(), &run_id).unwrap();
    assert_eq!(b.lookup("t#1", None).unwrap().as_deref(), Some("7"));
    b.settle(completed()).unwrap();
}

#[test]
fn a_queued_run_whose_id_exists_fails_where_it_settles_and_stores_nothing() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let new = new_run("agent");
    let first = Attempt::start(store.clone(), new.clone()).unwrap();
    first.settle(completed()).unwrap();
    let other = Attempt::start(store.clone(), new_run("f")).unwrap();
    let again = Attempt::start_queued(store.clone(), new.clone()).unwrap();
    again.queue_span(span("llm#1", "1"));
    other.queue_span(span("t#1", "1"));
    let err = again.settle(completed()).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");
    // The other run's queued span was written all the same.
    assert_eq!(spans_of(&path, other.rid().unwrap()), 1);
    assert_eq!(spans_of(&path, first.rid().unwrap()), 0);
    other.settle(completed()).unwrap();
}

#[test]
fn the_writer_remembers_a_bounded_number_of_trace_ids() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let runs = 3000;
    for _ in 0..runs {
        let a = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
        a.queue_span(span("llm#1", "1"));
        a.settle(completed()).unwrap();
        assert!(store.cached_traces() <= 1024);
    }
    // Every span is still stored under its own run's trace, including
    // those of runs the writer no longer remembered.
    let stray: (i64, i64) = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT (SELECT count(*) FROM spans WHERE rid IS NULL OR tid != -rid), \
             (SELECT count(*) FROM traces)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(stray, (0, 0));
    let spans: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM spans", [], |r| r.get(0))
        .unwrap();
    assert_eq!(spans, runs);
}

/// Queues the span of task step `t#1` replayed.
fn queue_replayed_t1(a: &Attempt) {
    a.queue_replayed_span(
        crate::ids::new_ulid(),
        None,
        "task".into(),
        "t".into(),
        1.0,
        "t#1".into(),
        true,
    );
}

/// `(spans of run rid, those stored under -rid, rows of traces)`.
fn own_trace(path: &str, rid: i64) -> (i64, i64, i64) {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT (SELECT count(*) FROM spans WHERE rid = ?1), \
             (SELECT count(*) FROM spans WHERE rid = ?1 AND tid = -?1), \
             (SELECT count(*) FROM traces)",
            [rid],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
}

#[test]
fn a_run_stores_its_spans_under_minus_its_rid_on_every_write_path() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    // A row with a commit of its own: a step's span, a queued span, a
    // replayed step's span, a batched step's span.
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    a.commit("t#1", "1", Some(span("t#1", "1")), None).unwrap();
    a.queue_span(span("t#1", "1"));
    queue_replayed_t1(&a);
    a.set_batch().unwrap();
    a.commit("t#2", "2", Some(span("t#2", "2")), None).unwrap();
    a.settle(completed()).unwrap();
    // A queued row, its span in the same commit.
    let q = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
    q.queue_span(span("llm#1", "1"));
    q.settle(completed()).unwrap();
    // A run resumed by another process, whose writer never saw it created.
    let c = Attempt::start(store.clone(), new_run("f")).unwrap();
    c.commit("t#1", "1", Some(span("t#1", "1")), None).unwrap();
    let run_id = c.run.run_id.clone();
    drop(c);
    let later: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let c = Attempt::resume(later.clone(), &run_id).unwrap();
    c.commit("t#2", "2", Some(span("t#2", "2")), None).unwrap();
    c.settle(completed()).unwrap();
    store.flush().unwrap();
    later.flush().unwrap();
    assert_eq!(own_trace(&path, a.rid().unwrap()), (4, 4, 0));
    assert_eq!(own_trace(&path, q.rid().unwrap()), (1, 1, 0));
    assert_eq!(own_trace(&path, c.rid().unwrap()), (2, 2, 0));
}

#[test]
fn runs_given_one_trace_id_each_keep_their_spans_under_their_own_rid() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let first = new_run("f");
    let second = NewRun {
        trace_id: first.trace_id.clone(),
        ..new_run("g")
    };
    let a = Attempt::start(store.clone(), first).unwrap();
    let b = Attempt::start(store.clone(), second).unwrap();
    for i in 1..=3 {
        let key = format!("t#{i}");
        a.commit(&key, "1", Some(span(&key, "1")), None).unwrap();
        b.commit(&key, "2", Some(span(&key, "2")), None).unwrap();
    }
    // Replayed spans of both, queued side by side: one batch of inserts.
    for attempt in [&a, &b, &a, &b] {
        queue_replayed_t1(attempt);
    }
    a.settle(completed()).unwrap();
    b.settle(completed()).unwrap();
    store.flush().unwrap();
    assert_eq!(own_trace(&path, a.rid().unwrap()), (5, 5, 0));
    assert_eq!(own_trace(&path, b.rid().unwrap()), (5, 5, 0));
}

#[test]
fn queued_spans_never_outgrow_the_backlog_bound() {
    let dir = tempdir::Dir::new();
    let store = Arc::new(SqliteStore::open(&dir.path("runs.db")).unwrap());
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    let limit = crate::store::sqlite::MAX_BACKLOG;
    for i in 0..3 * limit {
        a.queue_span(span(&format!("t#{i}"), "1"));
        assert!(store.queued() < limit);
    }
    store.flush().unwrap();
    let n: i64 = rusqlite::Connection::open(dir.path("runs.db"))
        .unwrap()
        .query_row("SELECT count(*) FROM spans", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 3 * limit as i64);
}

#[test]
fn steps_replay_in_a_later_attempt() {
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    let run_id = a.run.run_id.clone();
    let (k1, hit) = a.reserve("", "t", None, None).unwrap();
    assert_eq!((k1.as_str(), hit), ("t#1", None));
    assert_eq!(
        &*a.commit(&k1, "10", Some(span(&k1, "10")), None).unwrap(),
        "10"
    );
    let (k2, _) = a.reserve("", "t", None, None).unwrap();
    a.commit(&k2, "20", None, None).unwrap();
    a.settle(Settlement {
        status: "paused".into(),
        output_json: None,
        error_json: None,
        ..Default::default()
    })
    .unwrap();

    let b = Attempt::resume(store.clone(), &run_id).unwrap();
    assert_eq!(
        b.reserve("", "t", None, None).unwrap().1.as_deref(),
        Some("10")
    );
    assert_eq!(
        b.reserve("", "t", None, None).unwrap().1.as_deref(),
        Some("20")
    );
    assert_eq!(b.reserve("", "t", None, None).unwrap().1, None);
}

#[test]
fn a_resume_journals_its_answers_and_reads_its_span_mark_with_the_claim() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    let run_id = a.run.run_id.clone();
    let rid = a.rid().unwrap();
    a.commit("t#1", "1", Some(span("t#1", "1")), None).unwrap();
    let pending = |id: &str| InterruptRow {
        interrupt_id: id.into(),
        kind: "approve".into(),
        question: None,
        payload_json: None,
    };
    a.settle(Settlement {
        status: "paused".into(),
        pending: vec![pending("go"), pending("later")],
        ..Default::default()
    })
    .unwrap();
    let mark: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT max(sid) FROM spans", [], |r| r.get(0))
        .unwrap();

    let answers = [("go".to_string(), "true".to_string())];
    let b = Attempt::resume_answering(store.clone(), &run_id, &answers).unwrap();
    // In the attempt's journal and in the store, committed by the claim.
    assert_eq!(
        b.lookup("__interrupt__:go", None).unwrap().as_deref(),
        Some("true")
    );
    let db = rusqlite::Connection::open(&path).unwrap();
    let stored: String = db
        .query_row(
            "SELECT value_json FROM journal WHERE rid = ?1 AND step_key = '__interrupt__:go'",
            [rid],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, "true");
    let left: Vec<String> = db
        .prepare("SELECT interrupt_id FROM pending_interrupts WHERE rid = ?1")
        .unwrap()
        .query_map([rid], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(left, ["later"]);
    assert_eq!(b.span_mark().unwrap(), Some(mark));
    // A later answer to the same interrupt does not replace it.
    b.settle(Settlement {
        status: "paused".into(),
        ..Default::default()
    })
    .unwrap();
    let again = [("go".to_string(), "false".to_string())];
    let c = Attempt::resume_answering(store.clone(), &run_id, &again).unwrap();
    assert_eq!(
        c.lookup("__interrupt__:go", None).unwrap().as_deref(),
        Some("true")
    );
    c.settle(completed()).unwrap();
}

#[test]
fn first_write_wins_in_the_store() {
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    a.commit("k#1", "1", None, None).unwrap();
    assert_eq!(&*a.commit("k#1", "2", None, None).unwrap(), "1");
    assert_eq!(
        store.journal(a.run.rid).unwrap(),
        vec![("k#1".into(), "1".into())]
    );
}

#[test]
fn a_second_attempt_in_the_same_process_is_refused() {
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    let err = Attempt::resume(store.clone(), &a.run.run_id).err().unwrap();
    assert!(err.to_string().contains("already being executed"), "{err}");
}

#[test]
fn a_live_lease_of_another_process_is_refused_and_a_dead_one_taken_over() {
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    let run_id = a.run.run_id.clone();
    drop(a);
    let live = |_: &str, _: f64| true;
    let dead = |_: &str, _: f64| false;
    let manual = crate::store::takeover::Takeover::Manual;
    store
        .acquire(&run_id, "otherhost:1:1:n", now() + 60.0, &dead, manual)
        .unwrap();
    let err = store
        .acquire(&run_id, owner_id(), now() + 60.0, &live, manual)
        .err()
        .unwrap();
    assert!(err.to_string().contains("otherhost:1:1:n"), "{err}");
    store
        .acquire(&run_id, owner_id(), now() + 60.0, &dead, manual)
        .unwrap();
}

#[test]
fn settled_attempts_refuse_writes_and_revoked_fences_too() {
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    let f = a.root_fence().child();
    f.revoke();
    assert!(matches!(
        a.reserve("", "t", None, Some(&f)),
        Err(CoreError::Revoked(_))
    ));
    assert!(a.reserve("", "t", None, None).is_ok());
    a.settle(Settlement {
        status: "completed".into(),
        output_json: Some("1".into()),
        error_json: None,
        ..Default::default()
    })
    .unwrap();
    assert!(matches!(
        a.commit("t#9", "1", None, None),
        Err(CoreError::Revoked(_))
    ));
}

/// STORE-12: worker takeovers from a dead holder count; past the limit
/// the run is failed instead, and a manual resume still works.
#[test]
fn recoveries_past_the_limit_fail_the_run_and_a_manual_resume_works() {
    use crate::store::takeover::Takeover;
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    let run_id = a.run.run_id.clone();
    drop(a);
    let dead = |_: &str, _: f64| false;
    let recover = Takeover::Recover { max: 2 };
    for i in 0..2 {
        let holder = format!("gone:{i}:1:n");
        store
            .acquire(&run_id, &holder, now() + 60.0, &dead, recover)
            .unwrap();
    }
    let err = store
        .acquire(&run_id, owner_id(), now() + 60.0, &dead, recover)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("recovery attempts exhausted"),
        "{err}"
    );
    let row = store.get_run(&run_id).unwrap().unwrap();
    assert_eq!(row.status, "failed");
    assert!(row
        .error_json
        .unwrap()
        .contains("recovery attempts exhausted"));
    let b = Attempt::resume(store.clone(), &run_id).unwrap();
    b.settle(Settlement {
        status: "completed".into(),
        output_json: Some("1".into()),
        ..Default::default()
    })
    .unwrap();
    // Settling starts the count again.
    store
        .acquire(&run_id, "gone:9:1:n", now() + 60.0, &dead, recover)
        .unwrap();
    store
        .acquire(&run_id, owner_id(), now() + 60.0, &dead, recover)
        .unwrap();
}

/// STORE-11: the heartbeat renews only leases this process holds; a run
/// taken over is reported lost and its attempt stops with the error.
#[test]
fn a_taken_over_attempt_is_lost_at_its_next_renewal() {
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    assert_eq!(
        store
            .renew_leases(owner_id(), now() + 60.0, &[a.run.rid, 999])
            .unwrap(),
        vec![a.run.rid]
    );
    let dead = |_: &str, _: f64| false;
    store
        .acquire(
            &a.run.run_id,
            "other:1:1:n",
            now() + 60.0,
            &dead,
            crate::store::takeover::Takeover::Manual,
        )
        .unwrap();
    assert!(store
        .renew_leases(owner_id(), now() + 60.0, &[a.run.rid])
        .unwrap()
        .is_empty());
    let err = a.commit("t#1", "1", None, None).unwrap_err();
    assert!(err.to_string().contains("moved to another owner"), "{err}");
    assert!(store.journal(a.run.rid).unwrap().is_empty());
}

/// STORE-11: once the run moved on (and even after the new owner
/// settled it), the old attempt journals, settles and traces nothing.
#[test]
fn an_attempt_taken_over_stores_nothing_even_after_the_run_settled() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    let dead = |_: &str, _: f64| false;
    let other = "other:1:1:n";
    store
        .acquire(
            &a.run.run_id,
            other,
            now() + 60.0,
            &dead,
            crate::store::takeover::Takeover::Manual,
        )
        .unwrap();
    let done = Settlement {
        status: "completed".into(),
        output_json: Some("1".into()),
        ..Default::default()
    };
    store.settle(a.run.rid, other, &done).unwrap();
    a.queue_span(span("t#1", "2"));
    store.flush().unwrap();
    assert_eq!(span_count(&path), 0);
    let err = a.commit("t#1", "2", None, None).unwrap_err();
    assert!(err.to_string().contains("moved to another owner"), "{err}");
    let err = a
        .settle(Settlement {
            status: "failed".into(),
            ..Default::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("moved to another owner"), "{err}");
    let row = store.get_run(&a.run.run_id).unwrap().unwrap();
    assert_eq!(
        (row.status.as_str(), row.output_json.as_deref()),
        ("completed", Some("1"))
    );
    assert!(store.journal(a.run.rid).unwrap().is_empty());
}

#[test]
fn deferred_commits_are_durable_after_sync() {
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    for i in 0..500 {
        let key = format!("map#1[{i}]/t#1");
        let stored = a.commit_deferred(&key, &i.to_string(), Some(span(&key, "x")), None);
        assert_eq!(&*stored.unwrap(), i.to_string());
    }
    assert_eq!(
        &*a.commit_deferred("map#1[0]/t#1", "9", None, None).unwrap(),
        "0"
    );
    a.sync().unwrap();
    assert_eq!(store.journal(a.run.rid).unwrap().len(), 500);
}

fn span_count(path: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT count(*) FROM spans", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn queued_spans_reach_the_store_without_a_commit() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    a.queue_span(span("x#1", "1"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while span_count(&path) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(span_count(&path), 1);
}

#[test]
fn discard_deletes_the_run_and_everything_it_stored() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let a = Attempt::start(store.clone(), new_run("p")).unwrap();
    a.commit("t#1", "1", Some(span("t#1", "1")), None).unwrap();
    a.save_agent_state(
        &AgentStateRow {
            scope_key: String::new(),
            messages_json: "[]".into(),
            partial_results_json: None,
            turn: 1,
        },
        None,
    )
    .unwrap();
    let run_id = a.run.run_id.clone();
    a.discard().unwrap();
    assert!(store.get_run(&run_id).unwrap().is_none());
    assert_eq!(span_count(&path), 0);
    assert!(store.journal(a.run.rid).unwrap().is_empty());
    assert!(store.load_agent_state(a.run.rid, "").unwrap().is_none());
}

/// AGENT-53: a first attempt reads only snapshots it stored itself
/// (none exist before it), a later attempt reads the store.
#[test]
fn agent_snapshots_load_in_the_attempt_that_saved_them_and_after_resume() {
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("agent")).unwrap();
    assert!(a.load_agent_state("").unwrap().is_none());
    let row = AgentStateRow {
        scope_key: String::new(),
        messages_json: "[1]".into(),
        partial_results_json: None,
        turn: 2,
    };
    a.save_agent_state(&row, None).unwrap();
    assert_eq!(a.load_agent_state("").unwrap().unwrap().turn, 2);
    let run_id = a.run.run_id.clone();
    a.settle(Settlement {
        status: "paused".into(),
        ..Default::default()
    })
    .unwrap();
    drop(a);
    let b = Attempt::resume(store, &run_id).unwrap();
    let loaded = b.load_agent_state("").unwrap().unwrap();
    assert_eq!((loaded.messages_json.as_str(), loaded.turn), ("[1]", 2));
}

#[test]
fn prior_llm_usage_sums_the_run_or_one_steps_agent_spans() {
    use crate::store::UsageRow;
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    let agent = |key: &str| SpanRow {
        span_id: crate::ids::new_ulid(),
        kind: "agent".into(),
        name: "writer".into(),
        status: "ok".into(),
        step_key: Some(key.into()),
        ..Default::default()
    };
    let llm = |parent: &SpanRow, tokens: i64, usd: f64| SpanRow {
        span_id: crate::ids::new_ulid(),
        parent_span_id: Some(parent.span_id.clone()),
        kind: "llm".into(),
        name: "m".into(),
        status: "ok".into(),
        usage: Some(UsageRow {
            input_tokens: tokens,
            output_tokens: 0,
            cost_usd: Some(usd),
            cost_complete: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    let (w1, w2) = (agent("writer#1"), agent("writer#2"));
    a.queue_span(llm(&w1, 10, 0.5));
    a.queue_span(llm(&w2, 7, 0.25));
    a.queue_span(w1);
    a.queue_span(w2);
    assert_eq!(
        a.prior_llm_usage(None).unwrap(),
        (0, 0.0),
        "a first attempt has no past"
    );
    a.settle(Settlement {
        status: "paused".into(),
        ..Default::default()
    })
    .unwrap();
    let b = Attempt::resume(store.clone(), &a.run.run_id).unwrap();
    assert_eq!(b.prior_llm_usage(None).unwrap(), (17, 0.75));
    assert_eq!(b.prior_llm_usage(Some("writer#2")).unwrap(), (7, 0.25));
    assert_eq!(b.prior_llm_usage(Some("writer#9")).unwrap(), (0, 0.0));
}

#[test]
fn batched_steps_are_handed_back_at_once_and_committed_by_the_writer_in_order() {
    let (_d, store) = temp_store();
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    a.set_batch().unwrap();
    assert!(a.batches(None) && !a.batches(Some(&a.root_fence().child())));
    for i in 1..=300 {
        let key = format!("t#{i}");
        let stored = a.commit(&key, &i.to_string(), Some(span(&key, "x")), None);
        assert_eq!(&*stored.unwrap(), i.to_string());
    }
    // The writer commits on its own, within its latency; a read of the
    // journal by this process commits whatever is still pending first.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut count = 0;
    while std::time::Instant::now() < deadline {
        let conn = rusqlite::Connection::open(store.path()).unwrap();
        count = conn
            .query_row("SELECT count(*) FROM journal", [], |r| r.get::<_, i64>(0))
            .unwrap();
        if count == 300 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(count, 300);
    let journal = store.journal(a.run.rid).unwrap();
    assert_eq!(journal.len(), 300);
}

#[test]
fn a_lost_batch_poisons_later_steps_and_the_settlement() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    a.set_batch().unwrap();
    a.commit("t#1", "1", None, None).unwrap();
    store.flush().unwrap();
    // Another connection renames the table the journal goes to.
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute_batch("ALTER TABLE journal RENAME TO journal_away")
        .unwrap();
    a.commit("t#2", "2", None, None).unwrap();
    // Fails here or in the background writer: either way the slot
    // holds the failure once the flush returns.
    let _ = store.flush();
    other
        .execute_batch("ALTER TABLE journal_away RENAME TO journal")
        .unwrap();
    assert!(a.commit("t#3", "3", None, None).is_err());
    let settled = a.settle(Settlement {
        status: "completed".into(),
        ..Default::default()
    });
    assert!(settled.is_err(), "a run with a lost step is not settled");
    store.flush().unwrap();
    assert_eq!(
        store.journal(a.run.rid).unwrap(),
        vec![("t#1".into(), "1".into())],
        "nothing after the lost step was stored"
    );
}

#[test]
fn a_failed_span_write_is_recorded_once_for_a_warning() {
    let dir = tempdir::Dir::new();
    let path = dir.path("runs.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let a = Attempt::start(store.clone(), new_run("f")).unwrap();
    crate::store::slot::take_span_write_error();
    // Another connection drops the table the span goes to.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("DROP TABLE spans")
        .unwrap();
    a.queue_span(span("t#1", "1"));
    assert!(store.flush().is_err());
    let recorded = crate::store::slot::take_span_write_error();
    assert!(recorded.is_some_and(|m| m.contains("spans")));
    assert!(crate::store::slot::take_span_write_error().is_none());
}
