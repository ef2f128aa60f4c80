//! The wait decision of an attempt: sleep, receive, receive_all.

use crate::clock;
use crate::error::{CoreError, CoreResult};
use crate::journal::Fence;
use crate::run::Attempt;
use crate::store::durable::{WaitRow, EPSILON, POLL};
use crate::store::InterruptRow;
use std::sync::Arc;
use std::time::Instant;

/// How a driver waits when the answer is not there yet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Sleep in place (GIL released) and decide again: the sync driver.
    Block,
    /// Return `Outcome::Block` at once; the caller awaits and asks again
    /// (the async driver).
    Poll,
    /// Settle `paused` (`wait=False`, the worker).
    Park,
}

#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// The wait is over. `value`: the journaled value of a receive;
    /// `since`: wall time the wait began, when this attempt is the first to
    /// see it satisfied.
    Ready {
        value: Option<String>,
        since: Option<f64>,
    },
    /// Decide again after at most this many seconds.
    Block { seconds: f64 },
    /// Raise the pause: the attempt will settle `paused` on this interrupt.
    Park { interrupt: InterruptRow },
}

#[derive(Debug, Clone)]
enum Kind {
    Sleep {
        wake_at: f64,
    },
    Receive {
        name: String,
        deadline: Option<f64>,
        default_json: String,
    },
    /// `await_until`: woken by any signal newer than the evaluation's
    /// watermark, or by the deadline.
    Await {
        deadline: Option<f64>,
    },
}

/// One reached wait: its journal key and what satisfies it.
#[derive(Clone)]
pub struct WaitSpec {
    pub key: String,
    kind: Kind,
    /// The journal already held the key when it was reached.
    pub journaled: bool,
    /// A receive's journaled value (it needs no decision).
    done: Option<String>,
    fence: Option<Fence>,
}

impl WaitSpec {
    pub fn wake_at(&self) -> Option<f64> {
        match &self.kind {
            Kind::Sleep { wake_at } => Some(*wake_at),
            Kind::Receive { deadline, .. } | Kind::Await { deadline } => *deadline,
        }
    }
}

/// `[<seq or null>,<value_json>]`, the journal record of a receive.
fn split_record(key: &str, text: &str) -> CoreResult<(Option<i64>, String)> {
    let bad =
        || CoreError::Serialization(format!("journal value of '{key}' is not a receive record"));
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(bad)?;
    let (seq, value) = inner.split_once(',').ok_or_else(bad)?;
    let seq = match seq {
        "null" => None,
        s => Some(s.parse::<i64>().map_err(|_| bad())?),
    };
    Ok((seq, value.to_string()))
}

fn wake_time(key: &str, text: &str) -> CoreResult<f64> {
    clock::parse_iso(text).ok_or_else(|| {
        CoreError::Serialization(format!(
            "journal value of '{key}' is not a wake time: {text}"
        ))
    })
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

impl Attempt {
    /// Journals `value` under `key` with, when given, a timer, in one
    /// commit (first write wins); returns the stored value.
    fn commit_wait_step(
        &self,
        key: &str,
        value: &str,
        fence: Option<&Fence>,
        timer: Option<(&str, Option<f64>)>,
    ) -> CoreResult<Arc<str>> {
        self.check(fence)?;
        if let Some(v) = self.journal_get(key) {
            return Ok(v);
        }
        if self.is_replay_only() {
            return Err(crate::error::CoreError::ReplayEnd(key.to_string()));
        }
        self.sync_point()?;
        let winner = self.store().commit_wait(self.rid()?, key, value, timer)?;
        Ok(self.journal_record(key, Arc::from(winner.as_deref().unwrap_or(value))))
    }

    /// EXT-10: fails with `Cancelled` when a cancel request for the run is
    /// stored. Unforced (at step boundaries) it reads the store at most once
    /// per `POLL`, unless this process recorded a request since.
    pub fn check_cancel(&self, force: bool) -> CoreResult<()> {
        {
            let epoch = clock::epoch();
            let mut last = self.durable.last_cancel_check.lock();
            if !force && last.is_some_and(|(t, e)| e == epoch && t.elapsed() < POLL) {
                return Ok(());
            }
            *last = Some((Instant::now(), epoch));
        }
        match self.store().cancel_request(self.rid()?)? {
            Some(reason) => Err(CoreError::Cancelled(reason.unwrap_or_default())),
            None => Ok(()),
        }
    }

    /// EXT-1: reaches `sleep#<n>`, journaling its wake time (and a timer)
    /// on first reach.
    pub fn begin_sleep(
        &self,
        scope: &str,
        seconds: f64,
        fence: Option<&Fence>,
    ) -> CoreResult<WaitSpec> {
        let (key, hit) = self.reserve(scope, "sleep", Some(wait_call("sleep")), fence)?;
        let journaled = hit.is_some();
        let wake_at = match hit {
            Some(v) => wake_time(&key, &v)?,
            None => {
                let wake = clock::now() + seconds.max(0.0);
                let value = json_str(&clock::iso(wake));
                let timer = (seconds > 0.0).then_some((key.as_str(), Some(wake)));
                let stored = self.commit_wait_step(&key, &value, fence, timer)?;
                wake_time(&key, &stored)?
            }
        };
        Ok(WaitSpec {
            key,
            kind: Kind::Sleep { wake_at },
            journaled,
            done: None,
            fence: fence.cloned(),
        })
    }

    /// EXT-4: reaches `receive:<name>#<n>`; with a timeout its deadline is
    /// journaled (under `<key>:deadline`) on first reach.
    pub fn begin_receive(
        &self,
        scope: &str,
        name: &str,
        timeout: Option<f64>,
        default_json: String,
        fence: Option<&Fence>,
    ) -> CoreResult<WaitSpec> {
        let (key, hit) = self.reserve(
            scope,
            &format!("receive:{name}"),
            Some(wait_call("receive")),
            fence,
        )?;
        let mut spec = WaitSpec {
            key: key.clone(),
            kind: Kind::Receive {
                name: name.to_string(),
                deadline: None,
                default_json,
            },
            journaled: hit.is_some(),
            done: None,
            fence: fence.cloned(),
        };
        if let Some(v) = hit {
            let (seq, value) = split_record(&key, &v)?;
            if let Some(seq) = seq {
                self.durable.cursors.lock().insert(name.to_string(), seq);
            }
            spec.done = Some(value);
            return Ok(spec);
        }
        if let Some(t) = timeout {
            let deadline = self.journaled_deadline(&key, t, fence)?;
            if let Kind::Receive { deadline: d, .. } = &mut spec.kind {
                *d = Some(deadline);
            }
        }
        Ok(spec)
    }

    /// EXT-4: every delivered, unconsumed signal of `name`, consumed and
    /// journaled as one list; returns the list's JSON.
    pub fn receive_all(
        &self,
        scope: &str,
        name: &str,
        fence: Option<&Fence>,
    ) -> CoreResult<String> {
        self.check_cancel(true)?;
        let (key, hit) = self.reserve(
            scope,
            &format!("receive_all:{name}"),
            Some(wait_call("receive_all")),
            fence,
        )?;
        let text = match hit {
            Some(v) => v,
            None => {
                let after = self.cursor(name);
                let rid = self.rid()?;
                let found = self.store().signals_after(rid, name, after)?;
                let last = found
                    .last()
                    .map_or_else(|| "null".to_string(), |(s, _)| s.to_string());
                let values: Vec<&str> = found.iter().map(|(_, v)| v.as_str()).collect();
                let record = format!("[{last},[{}]]", values.join(","));
                self.commit_wait_step(&key, &record, fence, None)?
            }
        };
        let (seq, list) = split_record(&key, &text)?;
        if let Some(seq) = seq {
            self.durable.cursors.lock().insert(name.to_string(), seq);
        }
        Ok(list)
    }

    /// EXT-5: reaches `await_until#<n>`; with a timeout its deadline is
    /// journaled on first reach. A journaled outcome is the spec's value.
    pub fn begin_await(
        &self,
        scope: &str,
        timeout: Option<f64>,
        fence: Option<&Fence>,
    ) -> CoreResult<WaitSpec> {
        let (key, hit) =
            self.reserve(scope, "await_until", Some(wait_call("await_until")), fence)?;
        let mut spec = WaitSpec {
            key: key.clone(),
            kind: Kind::Await { deadline: None },
            journaled: hit.is_some(),
            done: hit.map(|v| v.to_string()),
            fence: fence.cloned(),
        };
        if spec.done.is_none() {
            if let Some(t) = timeout {
                let deadline = self.journaled_deadline(&key, t, fence)?;
                spec.kind = Kind::Await {
                    deadline: Some(deadline),
                };
            }
        }
        Ok(spec)
    }

    /// The signal watermark of evaluation `k` of an `await_until`: the
    /// newest signal id when it first ran (journaled, so a replay waits for
    /// exactly the signals that evaluation had not seen).
    pub fn await_watermark(&self, spec: &WaitSpec, k: u32) -> CoreResult<i64> {
        let key = format!("{}:eval#{k}", spec.key);
        if let Some(v) = self.lookup(&key, spec.fence.as_ref())? {
            return v
                .parse()
                .map_err(|_| CoreError::Serialization(format!("journal value of '{key}': {v}")));
        }
        let rid = self.rid()?;
        let sid = self.store().last_signal_id(rid)?;
        let stored = self.commit_wait_step(&key, &sid.to_string(), spec.fence.as_ref(), None)?;
        stored
            .parse()
            .map_err(|_| CoreError::Serialization(format!("journal value of '{key}': {stored}")))
    }

    /// When a blocked wait must decide again: its own wake time or the
    /// deadline it runs under, whichever comes first.
    fn wake_or_deadline(&self, spec: &WaitSpec) -> Option<f64> {
        match (spec.wake_at(), self.deadline_under(spec.fence.as_ref())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The fence for the body of nested flow `flow` at step `key` with a
    /// `timeout` (OPS-12): its deadline is journaled (under
    /// `<key>:deadline`) when first reached, so a later attempt keeps it,
    /// and it runs under the tighter of that and `fence`'s.
    pub fn nested_deadline(
        &self,
        key: &str,
        flow: &str,
        timeout: f64,
        fence: &Fence,
    ) -> CoreResult<Fence> {
        let dkey = format!("{key}:deadline");
        let at = match self.lookup(&dkey, Some(fence))? {
            Some(v) => wake_time(&dkey, &v)?,
            None => {
                let at = clock::now() + timeout.max(0.0);
                let stored =
                    self.commit_wait_step(&dkey, &json_str(&clock::iso(at)), Some(fence), None)?;
                wake_time(&dkey, &stored)?
            }
        };
        Ok(fence.child_until(at, flow))
    }

    fn journaled_deadline(&self, key: &str, t: f64, fence: Option<&Fence>) -> CoreResult<f64> {
        let dkey = format!("{key}:deadline");
        match self.lookup(&dkey, fence)? {
            Some(v) => wake_time(&dkey, &v),
            None => {
                let wake = clock::now() + t.max(0.0);
                let stored = self.commit_wait_step(
                    &dkey,
                    &json_str(&clock::iso(wake)),
                    fence,
                    Some((key, Some(wake))),
                )?;
                wake_time(&dkey, &stored)
            }
        }
    }

    fn cursor(&self, name: &str) -> i64 {
        self.durable.cursors.lock().get(name).copied().unwrap_or(0)
    }

    /// The value if the wait is satisfied now (journaling a receive's).
    fn decide(&self, spec: &WaitSpec, after: Option<i64>) -> CoreResult<Option<Option<String>>> {
        match &spec.kind {
            Kind::Await { deadline } => {
                let rid = self.rid()?;
                let newest = self.store().last_signal_id(rid)?;
                if newest > after.unwrap_or(0) {
                    return Ok(Some(Some("\"signal\"".into())));
                }
                let passed = deadline.is_some_and(|d| clock::now() >= d - EPSILON);
                Ok(passed.then(|| Some("\"timeout\"".into())))
            }
            // Within a microsecond: wake times are journaled at that precision.
            Kind::Sleep { wake_at } => Ok((clock::now() >= wake_at - EPSILON).then_some(None)),
            Kind::Receive {
                name,
                deadline,
                default_json,
            } => {
                let seq = self.cursor(name) + 1;
                let rid = self.rid()?;
                let found = self.store().signal_at(rid, name, seq)?;
                let record = match found {
                    Some(v) => format!("[{seq},{v}]"),
                    None if deadline.is_some_and(|d| clock::now() >= d - EPSILON) => {
                        format!("[null,{default_json}]")
                    }
                    None => return Ok(None),
                };
                let stored =
                    self.commit_wait_step(&spec.key, &record, spec.fence.as_ref(), None)?;
                let (consumed, value) = split_record(&spec.key, &stored)?;
                if let Some(s) = consumed {
                    self.durable.cursors.lock().insert(name.clone(), s);
                }
                Ok(Some(Some(value)))
            }
        }
    }

    fn park_on(&self, spec: &WaitSpec, after: Option<i64>) -> (InterruptRow, WaitRow) {
        let module = self.durable.module.lock().clone();
        match &spec.kind {
            Kind::Await { deadline } => (
                InterruptRow {
                    interrupt_id: spec.key.clone(),
                    kind: "signal".into(),
                    question: None,
                    payload_json: Some(format!(
                        "{{\"timeout_at\": {}}}",
                        deadline.map_or_else(|| "null".into(), |d| json_str(&clock::iso(d)))
                    )),
                },
                WaitRow {
                    step_key: spec.key.clone(),
                    wake_at: *deadline,
                    after_sid: Some(after.unwrap_or(0)),
                    module,
                    ..Default::default()
                },
            ),
            Kind::Sleep { wake_at } => (
                InterruptRow {
                    interrupt_id: format!("timer:{}", spec.key),
                    kind: "timer".into(),
                    question: None,
                    payload_json: Some(format!(
                        "{{\"wake_at\": {}}}",
                        json_str(&clock::iso(*wake_at))
                    )),
                },
                WaitRow {
                    step_key: spec.key.clone(),
                    wake_at: Some(*wake_at),
                    module,
                    ..Default::default()
                },
            ),
            Kind::Receive { name, deadline, .. } => {
                let n = spec.key.rsplit('#').next().unwrap_or("1");
                (
                    InterruptRow {
                        interrupt_id: format!("signal:{name}#{n}"),
                        kind: "signal".into(),
                        question: None,
                        payload_json: Some(format!("{{\"name\": {}}}", json_str(name))),
                    },
                    WaitRow {
                        step_key: spec.key.clone(),
                        wake_at: *deadline,
                        signal_name: Some(name.clone()),
                        signal_seq: Some(self.cursor(name) + 1),
                        module,
                        ..Default::default()
                    },
                )
            }
        }
    }

    /// Parks on a reached wait whatever its state (a flow's retry backoff,
    /// EXT-8: the next attempt must run in a new attempt of the run).
    pub fn force_park(&self, spec: &WaitSpec) -> InterruptRow {
        let (interrupt, row) = self.park_on(spec, None);
        *self.durable.parked.lock() = Some(row);
        interrupt
    }

    /// Answers a reached wait: ready, block (sleeping here in `Mode::Block`
    /// until the deadline, a signal or a cancel request), or park.
    pub fn resolve(&self, spec: &WaitSpec, mode: Mode) -> CoreResult<Outcome> {
        self.resolve_after(spec, None, mode)
    }

    /// `resolve` for an `await_until` evaluation that saw signals up to
    /// `after`: ready with `"signal"` (evaluate again) or `"timeout"`.
    pub fn resolve_after(
        &self,
        spec: &WaitSpec,
        after: Option<i64>,
        mode: Mode,
    ) -> CoreResult<Outcome> {
        if let Some(value) = &spec.done {
            return Ok(Outcome::Ready {
                value: Some(value.clone()),
                since: None,
            });
        }
        if self.is_replay_only() {
            // A replay writes nothing and never waits: the wait's timer rows
            // stay as the run left them, and a wait not over ends the replay
            // as a park does.
            if let Some(value) = self.decide(spec, after)? {
                return Ok(Outcome::Ready { value, since: None });
            }
            let (interrupt, row) = self.park_on(spec, after);
            *self.durable.parked.lock() = Some(row);
            return Ok(Outcome::Park { interrupt });
        }
        let rid = self.rid()?;
        let mut marked = false;
        loop {
            self.check(spec.fence.as_ref())?;
            // Reaching the wait just looked (unless a poll interval passed);
            // while blocked, every round reads the store.
            self.check_cancel(marked)?;
            self.check_deadline(spec.fence.as_ref())?;
            if let Some(value) = self.decide(spec, after)? {
                let since = self.store().take_timer(rid, &spec.key)?;
                return Ok(Outcome::Ready { value, since });
            }
            if !marked {
                // Records when the wait began (for its span) and, with a
                // deadline, the timer.
                let wake = spec.wake_at();
                self.store().insert_timer(rid, &spec.key, wake)?;
                marked = true;
            }
            match mode {
                Mode::Park => {
                    let (interrupt, row) = self.park_on(spec, after);
                    *self.durable.parked.lock() = Some(row);
                    return Ok(Outcome::Park { interrupt });
                }
                Mode::Poll => {
                    let left = self
                        .wake_or_deadline(spec)
                        .map_or(POLL.as_secs_f64(), |d| (d - clock::now()).max(0.0));
                    return Ok(Outcome::Block {
                        seconds: left.min(POLL.as_secs_f64()),
                    });
                }
                Mode::Block => {
                    // The run's deadline wakes a blocked wait too (OPS-12).
                    clock::nap(self.wake_or_deadline(spec), self.store().wait_slice());
                }
            }
        }
    }
}

/// A durable wait as a journaled call of the body (issue 27): its kind,
/// no arguments compared.
fn wait_call(kind: &str) -> crate::journal::Call<'_> {
    crate::journal::Call { kind, digest: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::owner_id;
    use crate::store::durable::CancelOutcome;
    use crate::store::sqlite::durable::{due_runs, request_cancel, send_signal};
    use crate::store::sqlite::SqliteStore;
    use crate::store::{NewRun, Settlement, Store};
    use rusqlite::Connection;

    struct Tmp(std::path::PathBuf);
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn store() -> (Tmp, Arc<dyn Store>, String) {
        let dir =
            std::env::temp_dir().join(format!("composeai-durable-{}", crate::ids::new_ulid()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("runs.db").to_string_lossy().into_owned();
        let s: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        (Tmp(dir), s, path)
    }

    fn start(store: &Arc<dyn Store>) -> Attempt {
        Attempt::start(
            store.clone(),
            NewRun {
                run_id: crate::ids::new_ulid(),
                trace_id: crate::ids::new_ulid(),
                kind: "flow".into(),
                name: "f".into(),
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn paused(a: &Attempt, interrupt: InterruptRow) {
        a.settle(Settlement {
            status: "paused".into(),
            pending: vec![interrupt],
            ..Default::default()
        })
        .unwrap();
    }

    fn conn(path: &str) -> Connection {
        Connection::open(path).unwrap()
    }

    fn due(path: &str, now: f64) -> Vec<(String, &'static str)> {
        due_runs(
            &conn(path),
            now,
            100,
            &crate::owner::lease_is_live,
            crate::store::durable::Versions::Any,
        )
        .unwrap()
        .into_iter()
        .map(|d| (d.run_id, d.reason))
        .collect()
    }

    #[test]
    fn a_parked_sleep_is_due_after_its_wake_time_and_ready_on_resume() {
        let (_d, s, path) = store();
        let a = start(&s);
        let id = a.run.run_id.clone();
        let spec = a.begin_sleep("", 0.3, None).unwrap();
        assert_eq!(spec.key, "sleep#1");
        assert!(!spec.journaled);
        let wake = spec.wake_at().unwrap();
        assert!(matches!(
            a.resolve(&spec, Mode::Poll).unwrap(),
            Outcome::Block { .. }
        ));
        let Outcome::Park { interrupt } = a.resolve(&spec, Mode::Park).unwrap() else {
            panic!("expected a park")
        };
        assert_eq!(interrupt.interrupt_id, "timer:sleep#1");
        assert_eq!(interrupt.kind, "timer");
        paused(&a, interrupt);
        assert!(due(&path, wake - 0.1).is_empty());
        assert_eq!(due(&path, wake + 0.01), vec![(id.clone(), "timer")]);

        std::thread::sleep(std::time::Duration::from_secs_f64(0.35));
        let b = Attempt::resume(s.clone(), &id).unwrap();
        assert!(
            due(&path, wake + 1.0).is_empty(),
            "a resumed run is no longer parked"
        );
        let again = b.begin_sleep("", 0.3, None).unwrap();
        assert!(again.journaled);
        assert_eq!(again.wake_at(), Some(wake));
        let Outcome::Ready { value, since } = b.resolve(&again, Mode::Block).unwrap() else {
            panic!("expected ready")
        };
        assert_eq!(value, None);
        assert!(
            since.is_some(),
            "the first attempt past the wait traces its duration"
        );
        let Outcome::Ready { since, .. } = b.resolve(&again, Mode::Block).unwrap() else {
            panic!("expected ready")
        };
        assert_eq!(since, None, "the timer row is gone once satisfied");
    }

    #[test]
    fn signals_are_buffered_and_consumed_in_send_order_also_on_replay() {
        let (_d, s, path) = store();
        let a = start(&s);
        let id = a.run.run_id.clone();
        for v in ["1", "2", "3"] {
            send_signal(&mut conn(&path), &path, &id, "x", v).unwrap();
        }
        let first = a.begin_receive("", "x", None, "null".into(), None).unwrap();
        assert_eq!(first.key, "receive:x#1");
        let ready = |a: &Attempt, spec: &WaitSpec| match a.resolve(spec, Mode::Park).unwrap() {
            Outcome::Ready { value, .. } => value.unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(ready(&a, &first), "1");
        assert_eq!(a.receive_all("", "x", None).unwrap(), "[2,3]");
        let next = a.begin_receive("", "x", None, "null".into(), None).unwrap();
        let Outcome::Park { interrupt } = a.resolve(&next, Mode::Park).unwrap() else {
            panic!("nothing left to receive")
        };
        assert_eq!(interrupt.interrupt_id, "signal:x#2");
        paused(&a, interrupt);
        assert!(due(&path, 0.0).is_empty());
        send_signal(&mut conn(&path), &path, &id, "x", "\"four\"").unwrap();
        assert_eq!(due(&path, 0.0), vec![(id.clone(), "signal")]);

        let b = Attempt::resume(s.clone(), &id).unwrap();
        let r1 = b.begin_receive("", "x", None, "null".into(), None).unwrap();
        assert!(r1.journaled);
        assert_eq!(ready(&b, &r1), "1");
        assert_eq!(b.receive_all("", "x", None).unwrap(), "[2,3]");
        let r2 = b.begin_receive("", "x", None, "null".into(), None).unwrap();
        assert_eq!(ready(&b, &r2), "\"four\"");
    }

    #[test]
    fn a_receive_timeout_journals_the_default() {
        let (_d, s, _path) = store();
        let a = start(&s);
        let spec = a
            .begin_receive("", "y", Some(0.05), "\"dflt\"".into(), None)
            .unwrap();
        let Outcome::Ready { value, .. } = a.resolve(&spec, Mode::Block).unwrap() else {
            panic!("expected the default")
        };
        assert_eq!(value.as_deref(), Some("\"dflt\""));
        let journal = s.journal(a.run.rid).unwrap();
        assert!(journal.contains(&("receive:y#1".into(), "[null,\"dflt\"]".into())));
        assert!(journal.iter().any(|(k, _)| k == "receive:y#1:deadline"));
    }

    #[test]
    fn dead_lease_holders_are_recovered_and_live_ones_left_alone() {
        let (_d, s, path) = store();
        let a = start(&s);
        let id = a.run.run_id.clone();
        assert!(due(&path, 0.0).is_empty(), "this process holds the lease");
        conn(&path)
            .execute(
                "UPDATE runs SET lease_owner = ?1 WHERE run_id = ?2",
                rusqlite::params![
                    format!("{}:4000000000:1", owner_id().split(':').next().unwrap()),
                    id
                ],
            )
            .unwrap();
        assert_eq!(due(&path, 0.0), vec![(id, "recovered")]);
    }

    #[test]
    fn cancel_is_immediate_for_a_parked_run_and_observed_by_a_running_one() {
        let (_d, s, path) = store();
        let live = |_: &str, _: f64| true;
        let a = start(&s);
        assert_eq!(
            request_cancel(&mut conn(&path), &path, &a.run.run_id, Some("why"), &live).unwrap(),
            CancelOutcome::Requested
        );
        let spec = a.begin_sleep("", 60.0, None);
        assert!(matches!(spec, Err(CoreError::Cancelled(r)) if r == "why"));

        let b = start(&s);
        let spec = b.begin_sleep("", 60.0, None).unwrap();
        let Outcome::Park { interrupt } = b.resolve(&spec, Mode::Park).unwrap() else {
            panic!()
        };
        paused(&b, interrupt);
        assert_eq!(
            request_cancel(&mut conn(&path), &path, &b.run.run_id, None, &live).unwrap(),
            CancelOutcome::Cancelled
        );
        assert_eq!(
            s.get_run(&b.run.run_id).unwrap().unwrap().status,
            "cancelled"
        );
        assert!(s.pending(b.run.rid).unwrap().is_empty());
        let err = send_signal(&mut conn(&path), &path, &b.run.run_id, "x", "1").unwrap_err();
        assert!(err.to_string().contains("is cancelled"), "{err}");
    }
}
