//! The step machine of one graph run attempt (EXT-24, EXT-25, EXT-29).
//!
//! Python asks for the ready set, calls those nodes, hands their outcomes
//! back, calls the routers the core asks for, and hands the labels back;
//! the core merges, schedules the next step and writes the checkpoint in
//! the same transaction as the step's journal rows.

use super::checkpoint::{self, Pending, Progress, Rebuilt, Row};
use super::graph_error;
use super::reduce::{self, Op, State};
use super::spec::Graph;
use crate::error::{CoreError, CoreResult};
use crate::run::Attempt;
use crate::store::answer::{graph_answer_key, suspension_head};
use crate::store::graph::GraphTx;
use crate::store::{InterruptRow, Settlement, Store};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// A node scheduled in the current step.
#[derive(Debug, Clone)]
pub struct Exec {
    pub node: String,
    /// Its journal scope, `<node>@<step>` (the step its execution began in).
    pub scope: String,
    pub step: i64,
    /// The answer it resumes with (JSON), after a suspend.
    pub resume: Option<String>,
    pub attempt: i64,
    /// The node's journaled outcome, when this execution finished before
    /// (a retry after a crash): it is replayed, not run.
    pub done: Option<String>,
}

/// What a node returned.
#[derive(Debug, Clone)]
pub enum Outcome {
    Update(Option<State>),
    Suspend {
        payload: Value,
        update: Option<State>,
    },
    Goto {
        targets: Vec<String>,
        update: Option<State>,
    },
}

/// An executed node (by index), its goto choice (`None` = `END`) and its
/// suspend payload.
type Executed = (usize, Option<Vec<Option<usize>>>, Option<Value>);

/// What `step` decided.
pub struct Stepped {
    pub delta: String,
    pub routers: Vec<String>,
    pub status: Option<String>,
    pub ready: Vec<Exec>,
}

struct Merged {
    ops_json: String,
    /// Per executed node, in declaration order.
    outcomes: Vec<Executed>,
}

pub struct GraphRun {
    pub graph: Arc<Graph>,
    attempt: Arc<Attempt>,
    pub thread: Option<String>,
    pub state: State,
    pub progress: Progress,
    pub head: Option<String>,
    pub version: i64,
    /// The thread's chain: new checkpoints get ids on it (see
    /// `checkpoint::new_id`).
    chain: Option<i64>,
    snapshot_bytes: usize,
    delta_bytes: usize,
    links: usize,
    running: Vec<Exec>,
    merged: Option<Merged>,
    /// Checkpoints written with the next step's transaction.
    unsaved: Vec<Row>,
    max_steps: i64,
    deadline: Option<f64>,
    pub steps: i64,
    /// The status of the staged checkpoint.
    row_status: String,
}

/// Thread heads kept in memory, at most this many.
const HEAD_CACHE: usize = 64;

type HeadCache = Mutex<Vec<((String, String), Rebuilt)>>;

fn head_cache() -> &'static HeadCache {
    static CACHE: OnceLock<HeadCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Vec::new()))
}

/// The cached state of `thread` when its head is still `head`.
fn cached_head(path: &str, thread: &str, head: &str) -> Option<Rebuilt> {
    let mut cache = head_cache().lock();
    let at = cache
        .iter()
        .position(|((p, t), r)| p == path && t == thread && r.row.checkpoint_id == head)?;
    Some(cache.remove(at).1)
}

fn answer_key(p: &Pending) -> String {
    format!("{}@{}/resume#{}", p.node, p.step, p.attempt)
}

fn fresh_progress(graph: &Graph) -> Progress {
    Progress {
        step: 0,
        next: vec![graph.name_of(graph.start).to_string()],
        joins: vec![Vec::new(); graph.joins.len()],
        pending: Vec::new(),
    }
}

fn state_text(state: &State) -> String {
    serde_json::to_string(state).unwrap_or_else(|_| "{}".into())
}

fn ops_text(ops: &[Op]) -> String {
    Value::Array(ops.iter().map(Op::to_json).collect()).to_string()
}

/// Refuses answers that do not name exactly the suspended nodes (EXT-29).
pub fn check_answers(pending: &[Pending], names: &[String]) -> CoreResult<()> {
    let mut expected: Vec<&str> = pending.iter().map(|p| p.node.as_str()).collect();
    expected.sort();
    let mut got: Vec<&str> = names.iter().map(String::as_str).collect();
    got.sort();
    if expected.is_empty() || expected != got {
        let what = if expected.is_empty() {
            "no node is suspended".to_string()
        } else {
            format!("the suspended nodes are {expected:?}")
        };
        return Err(graph_error(
            "resume_invalid",
            format!("resume values must name exactly the suspended nodes: {what}, got {got:?}"),
            json!({"expected": expected, "got": got}),
        ));
    }
    Ok(())
}

/// The nodes of graph run `run_id` answered from outside for the
/// suspension it is paused at (`node:<name>` answers keyed by
/// `suspension_head`), by name; empty for no such run or suspension. What a
/// resume about to claim the run checks its own answers against: more may
/// be added until the claim, none after it.
pub fn answered_nodes(store: &dyn Store, run_id: &str) -> CoreResult<Vec<String>> {
    let Some(run) = store.get_run(run_id)? else {
        return Ok(Vec::new());
    };
    let mut head = None;
    store.read(&mut |tx| {
        head = suspension_head(tx, run_id, run.rid, run.args_json.as_deref())?;
        Ok(())
    })?;
    let Some(head) = head else {
        return Ok(Vec::new());
    };
    let suffix = format!("@{head}");
    Ok(store
        .journal(run.rid)?
        .into_iter()
        .filter_map(|(key, _)| {
            let node = key
                .strip_prefix("__interrupt__:node:")?
                .strip_suffix(&suffix)?;
            Some(node.to_string())
        })
        .collect())
}

impl GraphRun {
    /// Opens the run at its stored head. Unless `fresh`, the run continues
    /// where its head stands: a head this run wrote, or one where nodes
    /// wait (a rewound or forked thread, a resumed snapshot). Otherwise a
    /// new pass starts from the start node, `input` keys replacing the head
    /// state (a run that crashed before its first checkpoint starts over).
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        graph: Arc<Graph>,
        attempt: Arc<Attempt>,
        thread: Option<String>,
        input: Option<State>,
        fresh: bool,
        max_steps: i64,
        deadline: Option<f64>,
    ) -> CoreResult<GraphRun> {
        GraphRun::open_at(
            graph, attempt, thread, None, input, fresh, max_steps, deadline,
        )
    }

    /// `open` of a thread whose head and chain the caller read in the
    /// transaction that claimed it (`known`: `Some((head, chain))`); a head
    /// this process settled itself is not read again.
    #[allow(clippy::too_many_arguments)]
    pub fn open_at(
        graph: Arc<Graph>,
        attempt: Arc<Attempt>,
        thread: Option<String>,
        known: Option<(Option<String>, Option<i64>)>,
        input: Option<State>,
        fresh: bool,
        max_steps: i64,
        deadline: Option<f64>,
    ) -> CoreResult<GraphRun> {
        let rid = attempt.run.rid;
        let path = attempt.store().path().to_string();
        let mut chain = known.as_ref().and_then(|k| k.1);
        let known_head = known.map(|k| k.0);
        let cached = match (&thread, &known_head) {
            (Some(t), Some(Some(h))) => cached_head(&path, t, h),
            _ => None,
        };
        let mut found: Option<Rebuilt> = None;
        if cached.is_some() {
            found = cached;
        } else if !matches!(known_head, Some(None)) {
            let head_thread = thread.clone();
            attempt.store().read(&mut |conn| {
                let head = match (&known_head, &head_thread) {
                    (Some(h), _) => h.clone(),
                    (None, Some(t)) => conn.thread(t)?.and_then(|t| {
                        chain = t.chain;
                        t.head
                    }),
                    (None, None) => conn.run_head(rid)?.map(|r| r.checkpoint_id),
                };
                if let Some(h) = head {
                    let cached = head_thread
                        .as_deref()
                        .and_then(|t| cached_head(&path, t, &h));
                    found = match cached {
                        Some(r) => Some(r),
                        None => checkpoint::rebuild(conn, &h)?,
                    };
                }
                Ok(())
            })?;
        }
        let mut run = GraphRun {
            graph,
            attempt,
            thread,
            state: State::new(),
            progress: Progress::default(),
            head: None,
            version: 0,
            chain,
            snapshot_bytes: 0,
            delta_bytes: 0,
            links: 0,
            running: Vec::new(),
            merged: None,
            unsaved: Vec::new(),
            max_steps,
            deadline,
            steps: 0,
            row_status: "running".into(),
        };
        let continues = !fresh
            && found.as_ref().is_some_and(|r| {
                r.row.run_id.as_deref() == Some(run.attempt.run.run_id.as_str())
                    || !r.progress.pending.is_empty()
            });
        if let Some(r) = found {
            run.state = r.state;
            run.head = Some(r.row.checkpoint_id.clone());
            run.version = r.row.version;
            run.snapshot_bytes = r.snapshot_bytes;
            run.delta_bytes = r.delta_bytes;
            run.links = r.chain;
            if continues {
                run.progress = r.progress;
                return Ok(run);
            }
        }
        run.progress = fresh_progress(&run.graph);
        let ops: Vec<Op> = input
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| Op::Set(k, v))
            .collect();
        if ops.is_empty() && run.head.is_some() {
            return Ok(run);
        }
        for op in &ops {
            reduce::apply(&mut run.state, op.clone())?;
        }
        let delta = ops_text(&ops);
        run.stage_checkpoint("input", "running", delta);
        // The input precedes step 0.
        if let Some(row) = run.unsaved.last_mut() {
            row.step = -1;
        }
        Ok(run)
    }

    /// Opens a run from a snapshot handed back by the caller (a thread-less
    /// resume in a run that holds no checkpoint of it).
    pub fn from_snapshot(
        graph: Arc<Graph>,
        attempt: Arc<Attempt>,
        state: State,
        progress: Progress,
        max_steps: i64,
        deadline: Option<f64>,
    ) -> GraphRun {
        let mut run = GraphRun {
            graph,
            attempt,
            thread: None,
            state,
            progress,
            head: None,
            version: 0,
            chain: None,
            snapshot_bytes: 0,
            delta_bytes: 0,
            links: 0,
            running: Vec::new(),
            merged: None,
            unsaved: Vec::new(),
            max_steps,
            deadline,
            steps: 0,
            row_status: "running".into(),
        };
        run.stage_checkpoint("resume", "suspended", "[]".into());
        run
    }

    /// Builds the next checkpoint row (a snapshot when the policy says so)
    /// and moves the head to it; `commit` (or `answer`) writes it.
    fn stage_checkpoint(&mut self, source: &str, status: &str, delta: String) {
        self.delta_bytes += delta.len();
        self.links += 1;
        let snapshot = self.head.is_none()
            || checkpoint::wants_snapshot(self.snapshot_bytes, self.delta_bytes, self.links);
        let (delta_json, snapshot_json) = if snapshot {
            let text = state_text(&self.state);
            self.snapshot_bytes = text.len();
            self.delta_bytes = 0;
            self.links = 0;
            (None, Some(text))
        } else {
            (Some(delta), None)
        };
        self.version += 1;
        let row = Row {
            checkpoint_id: checkpoint::new_id(self.chain, self.version),
            thread_id: self.thread.clone(),
            rid: Some(self.attempt.run.rid),
            parent_id: self.head.clone(),
            version: self.version,
            source: source.to_string(),
            status: status.to_string(),
            run_id: Some(self.attempt.run.run_id.clone()),
            step: self.progress.step,
            created_at_ms: checkpoint::now_ms(),
            delta_json,
            snapshot_json,
            meta_json: self.progress.stored_text(),
        };
        self.head = Some(row.checkpoint_id.clone());
        self.unsaved.push(row);
    }

    /// Queues the finished span of a node of the current step (the lean
    /// trace of a run without an event bus): its attributes are the step's,
    /// its output the node's update as encoded.
    pub fn queue_node_span(
        &self,
        node: &str,
        span_id: String,
        parent: Option<String>,
        started_at: f64,
        ended_at: f64,
        output_json: Option<String>,
    ) -> CoreResult<()> {
        let exec = self
            .running
            .iter()
            .find(|e| e.node == node)
            .ok_or_else(|| {
                CoreError::Config(format!("node '{node}' is not running in this step"))
            })?;
        let name = serde_json::to_string(node).unwrap_or_default();
        self.attempt.queue_span(crate::store::SpanRow {
            span_id,
            parent_span_id: parent,
            kind: "task".into(),
            name: node.to_string(),
            started_at,
            ended_at: Some(ended_at),
            status: "ok".into(),
            step_key: Some(exec.scope.clone()),
            attributes_json: Some(format!(
                "{{\"step\":{},\"node\":{name},\"attempt\":{}}}",
                exec.step, exec.attempt
            )),
            output_json,
            ..Default::default()
        });
        Ok(())
    }

    pub fn pending(&self) -> &[Pending] {
        &self.progress.pending
    }

    /// The journal key of an answer given from outside the run (`compose
    /// answer`, the web UI) to suspended node `node`: keyed by the
    /// checkpoint the run is paused at, as `store::answer` writes it.
    fn outside_key(&self, node: &str) -> Option<String> {
        let head = self.head.as_deref()?;
        Some(format!(
            "__interrupt__:{}",
            graph_answer_key(&format!("node:{node}"), head)
        ))
    }

    /// The suspended nodes answered from outside the run for the suspension
    /// it was opened at, read from the journal loaded with the claim: once
    /// the run is claimed no outside answer can be added (`answer_in`
    /// refuses a leased run), so this is every one there will be.
    pub fn answered_outside(&self) -> CoreResult<Vec<String>> {
        let mut out = Vec::new();
        for p in &self.progress.pending {
            if let Some(key) = self.outside_key(&p.node) {
                if self.attempt.lookup(&key, None)?.is_some() {
                    out.push(p.node.clone());
                }
            }
        }
        Ok(out)
    }

    /// Durably records the answers for the suspended nodes, before any of
    /// them runs again. First write wins, as for `resume(answers=...)` of a
    /// flow (FLOW-43): a node answered from outside the run for this
    /// suspension resumes with that answer, whatever `values` gives it; a
    /// node answered only here is journaled under the outside key too, so
    /// a later outside answer to this suspension is refused as already
    /// answered. Together they must name exactly the suspended nodes.
    pub fn answer(&mut self, values: Vec<(String, String)>) -> CoreResult<()> {
        let mut by_node: HashMap<String, String> = values.into_iter().collect();
        let mut entries = Vec::new();
        for p in &self.progress.pending {
            let Some(key) = self.outside_key(&p.node) else {
                continue;
            };
            match self.attempt.lookup(&key, None)? {
                Some(earlier) => {
                    by_node.insert(p.node.clone(), earlier.to_string());
                }
                None => {
                    if let Some(v) = by_node.get(&p.node) {
                        entries.push((key, v.clone()));
                    }
                }
            }
        }
        let names: Vec<String> = by_node.keys().cloned().collect();
        check_answers(&self.progress.pending, &names)?;
        entries.extend(
            self.progress
                .pending
                .iter()
                .map(|p| (answer_key(p), by_node[&p.node].clone())),
        );
        let rid = self.attempt.run.rid;
        let staged = std::mem::take(&mut self.unsaved);
        self.attempt.commit_with(&entries, &mut |tx| {
            for r in &staged {
                tx.insert(r)?;
            }
            tx.delete_pending(rid)
        })
    }

    /// The nodes of the current step, in declaration order: answered
    /// suspended nodes and the scheduled ones, each once.
    pub fn ready(&mut self) -> CoreResult<Vec<Exec>> {
        if !self.running.is_empty() {
            return Ok(self.running.clone());
        }
        let step = self.progress.step;
        let mut out = Vec::new();
        for name in &self.graph.spec.nodes {
            if let Some(p) = self.progress.pending.iter().find(|p| &p.node == name) {
                if let Some(answer) = self.attempt.lookup(&answer_key(p), None)? {
                    let scope = format!("{name}@{}", p.step);
                    out.push(Exec {
                        node: name.clone(),
                        done: self.attempt.lookup(&scope, None)?.map(|v| v.to_string()),
                        scope,
                        step,
                        resume: Some(answer.to_string()),
                        attempt: p.attempt + 1,
                    });
                }
                continue;
            }
            if self.progress.next.iter().any(|n| n == name) {
                let scope = format!("{name}@{step}");
                out.push(Exec {
                    node: name.clone(),
                    done: self.attempt.lookup(&scope, None)?.map(|v| v.to_string()),
                    scope,
                    step,
                    resume: None,
                    attempt: 1,
                });
            }
        }
        self.running = out.clone();
        Ok(out)
    }

    fn resolve_goto(&self, node: usize, targets: &[String]) -> CoreResult<Vec<Option<usize>>> {
        let name = self.graph.name_of(node);
        let declared = self.graph.gotos[node].as_deref().unwrap_or(&[]);
        let mut out = Vec::new();
        for t in targets {
            let resolved = if t == super::END {
                Some(None)
            } else {
                self.graph.node(t).map(Some)
            };
            match resolved {
                Some(r) if declared.contains(&r) => out.push(r),
                _ => {
                    let names: Vec<&str> = declared
                        .iter()
                        .map(|d| d.map_or(super::END, |i| self.graph.name_of(i)))
                        .collect();
                    return Err(graph_error(
                        "goto_undeclared",
                        format!(
                            "node '{name}' returned goto('{t}'), which is not among its declared \
                             targets {names:?} -- declare it with graph.goto('{name}', [...])"
                        ),
                        json!({"node": name, "target": t, "declared": names}),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Merges the step's outcomes (one per ready node) and returns the
    /// delta to apply and the nodes whose routers must now be called.
    pub fn finish(
        &mut self,
        outcomes: Vec<(String, Outcome)>,
    ) -> CoreResult<(String, Vec<String>)> {
        let mut indexed: Vec<(usize, Outcome)> = Vec::new();
        for (name, outcome) in outcomes {
            let i = self
                .graph
                .node(&name)
                .filter(|_| self.running.iter().any(|e| e.node == name))
                .ok_or_else(|| {
                    CoreError::Config(format!("node '{name}' is not running in this step"))
                })?;
            indexed.push((i, outcome));
        }
        indexed.sort_by_key(|(i, _)| *i);
        let mut writes = Vec::new();
        let mut infos = Vec::new();
        let mut routers = Vec::new();
        for (i, outcome) in indexed {
            let name = self.graph.name_of(i).to_string();
            let (update, goto, suspended) = match outcome {
                Outcome::Update(u) => (u, None, None),
                Outcome::Suspend { payload, update } => (update, None, Some(payload)),
                Outcome::Goto { targets, update } => {
                    (update, Some(self.resolve_goto(i, &targets)?), None)
                }
            };
            if goto.is_none() && suspended.is_none() && self.graph.routes[i].is_some() {
                routers.push(i);
            }
            if let Some(u) = update {
                writes.push((name, u));
            }
            infos.push((i, goto, suspended));
        }
        let ops = reduce::merge(&self.graph, &mut self.state, &writes)?;
        let ops_json = ops_text(&ops);
        self.merged = Some(Merged {
            ops_json: ops_json.clone(),
            outcomes: infos,
        });
        Ok((
            ops_json,
            routers
                .iter()
                .map(|i| self.graph.name_of(*i).to_string())
                .collect(),
        ))
    }

    /// One step's outcomes in, in one call: merges them and returns the
    /// delta and the nodes whose routers must be called. Without routers
    /// the step is also scheduled, and committed unless the run stops here
    /// (then `commit` settles it); `status` and the next ready set follow.
    pub fn step(&mut self, outcomes: Vec<(String, Outcome)>) -> CoreResult<Stepped> {
        let (delta, routers) = self.finish(outcomes)?;
        if !routers.is_empty() {
            return Ok(Stepped {
                delta,
                routers,
                status: None,
                ready: Vec::new(),
            });
        }
        let (status, ready) = self.route(Vec::new())?;
        Ok(Stepped {
            delta,
            routers,
            status: Some(status),
            ready,
        })
    }

    /// The routers' labels in: schedules the step and commits it unless the
    /// run stops here; returns the status and the next ready set.
    pub fn route(&mut self, labels: Vec<(String, String)>) -> CoreResult<(String, Vec<Exec>)> {
        let status = self.schedule(labels)?;
        if status == "completed" || status == "suspended" {
            return Ok((status, Vec::new()));
        }
        self.commit(None)?;
        let ready = if status == "running" {
            self.ready()?
        } else {
            Vec::new()
        };
        Ok((status, ready))
    }

    /// Takes the routers' labels, schedules the next step and stages the
    /// step's checkpoint; `commit` writes it. Returns `running`,
    /// `completed`, `suspended`, `step_limit` or `deadline`.
    pub fn schedule(&mut self, labels: Vec<(String, String)>) -> CoreResult<String> {
        let merged = self
            .merged
            .take()
            .ok_or_else(|| CoreError::Config("advance() before finish()".into()))?;
        let labels: HashMap<String, String> = labels.into_iter().collect();
        let g = self.graph.clone();
        let n = g.spec.nodes.len();
        let mut next = vec![false; n];
        let mut pending: Vec<Pending> = Vec::new();
        let running = std::mem::take(&mut self.running);
        let mut joins = std::mem::take(&mut self.progress.joins);
        joins.resize(g.joins.len(), Vec::new());
        for (i, goto, suspended) in &merged.outcomes {
            let name = g.name_of(*i);
            let exec = running.iter().find(|e| e.node == name);
            if let Some(payload) = suspended {
                let (origin, attempt) = exec
                    .map(|e| (e.scope_step(), e.attempt))
                    .unwrap_or((self.progress.step, 1));
                pending.push(Pending {
                    node: name.to_string(),
                    step: origin,
                    payload: payload.clone(),
                    attempt,
                });
                continue;
            }
            match goto {
                Some(targets) => {
                    for t in targets.iter().flatten() {
                        next[*t] = true;
                    }
                }
                None => {
                    for t in g.edges[*i].iter().flatten() {
                        next[*t] = true;
                    }
                    if let Some(table) = &g.routes[*i] {
                        let label = labels.get(name).ok_or_else(|| {
                            CoreError::Config(format!("no label given for the router of '{name}'"))
                        })?;
                        match table.get(label) {
                            Some(t) => {
                                if let Some(t) = t {
                                    next[*t] = true;
                                }
                            }
                            None => {
                                let mut known: Vec<&String> = table.keys().collect();
                                known.sort();
                                return Err(graph_error(
                                    "route_unknown_label",
                                    format!(
                                        "the router of '{name}' returned {label:?}, which is not \
                                         one of its labels {known:?}"
                                    ),
                                    json!({"node": name, "label": label, "labels": known}),
                                ));
                            }
                        }
                    }
                }
            }
            for j in &g.joins_of[*i] {
                if !joins[*j].iter().any(|s| s == name) {
                    joins[*j].push(name.to_string());
                }
            }
        }
        for (j, (sources, target)) in g.joins.iter().enumerate() {
            if sources
                .iter()
                .all(|s| joins[j].iter().any(|d| d == g.name_of(*s)))
            {
                next[*target] = true;
                joins[j].clear();
            }
        }
        // Suspended nodes that were not run this step keep waiting.
        for p in std::mem::take(&mut self.progress.pending) {
            if !running.iter().any(|e| e.node == p.node) {
                pending.push(p);
            }
        }
        pending.sort_by_key(|p| g.node(&p.node));
        self.progress.pending = pending;
        self.progress.joins = joins;
        self.progress.next = (0..n)
            .filter(|i| next[*i])
            .map(|i| g.name_of(i).to_string())
            .collect();
        self.steps += 1;
        let status = if !self.progress.pending.is_empty() {
            "suspended"
        } else if self.progress.next.is_empty() {
            "completed"
        } else if self.steps >= self.max_steps {
            "step_limit"
        } else if self.deadline.is_some_and(|d| crate::time::now() > d) {
            "deadline"
        } else {
            "running"
        };
        let row_status = if status == "completed" || status == "suspended" {
            status
        } else {
            "running"
        };
        let step_row_step = self.progress.step;
        self.progress.step += 1;
        self.stage_checkpoint("step", row_status, merged.ops_json);
        if let Some(last) = self.unsaved.last_mut() {
            last.step = step_row_step;
        }
        self.row_status = row_status.to_string();
        Ok(status.to_string())
    }

    /// Writes the staged checkpoints (a lone node's update is recorded by
    /// its step's checkpoint), and moves the thread's head when the run
    /// stops, in one transaction. With `output_json` a finished or suspended
    /// run is settled in that same transaction.
    pub fn commit(&mut self, output_json: Option<String>) -> CoreResult<()> {
        let status = self.row_status.clone();
        let staged = std::mem::take(&mut self.unsaved);
        let thread = self.thread.clone();
        let head = self.head.clone().unwrap_or_default();
        let version = self.version;
        let thread_status = match status.as_str() {
            "completed" => "idle",
            other => other,
        };
        let mut work = |tx: &dyn GraphTx| -> CoreResult<()> {
            for r in &staged {
                tx.insert(r)?;
            }
            // A running thread's head is its newest checkpoint; the row
            // changes when the run stops.
            if let Some(t) = &thread {
                if thread_status != "running" {
                    tx.set_head(t, &head, version, thread_status)?;
                }
            }
            Ok(())
        };
        let settles = status == "completed" || status == "suspended";
        match output_json.filter(|_| settles) {
            Some(output) => {
                let settlement = self.settlement(&status, output);
                self.attempt.settle_with(settlement, &mut work)?;
                self.remember();
                Ok(())
            }
            None => self.attempt.commit_with(&[], &mut work),
        }
    }

    /// Marks a run that has nothing left to run in this attempt (finished
    /// or waiting before any step), so `commit` settles it.
    pub fn idle_status(&mut self) -> String {
        let status = if self.progress.pending.is_empty() {
            "completed"
        } else {
            "suspended"
        };
        self.row_status = status.to_string();
        status.to_string()
    }

    fn settlement(&self, status: &str, output_json: String) -> Settlement {
        if status == "suspended" {
            Settlement {
                status: "paused".into(),
                pending: self
                    .progress
                    .pending
                    .iter()
                    .map(|p| InterruptRow {
                        interrupt_id: format!("node:{}", p.node),
                        kind: "graph".into(),
                        question: None,
                        payload_json: Some(p.payload.to_string()),
                    })
                    .collect(),
                ..Default::default()
            }
        } else {
            Settlement {
                status: "completed".into(),
                output_json: Some(output_json),
                ..Default::default()
            }
        }
    }

    /// Keeps a settled thread run's head state for this process's next run
    /// of the thread (checkpoints never change, so a matching head id is
    /// the same state).
    fn remember(&self) {
        let (Some(thread), Some(head)) = (&self.thread, &self.head) else {
            return;
        };
        let mut cache = head_cache().lock();
        let key = (self.attempt.store().path().to_string(), thread.clone());
        cache.retain(|(k, _)| *k != key);
        if cache.len() >= HEAD_CACHE {
            cache.remove(0);
        }
        cache.push((
            key,
            Rebuilt {
                row: Row {
                    checkpoint_id: head.clone(),
                    version: self.version,
                    run_id: Some(self.attempt.run.run_id.clone()),
                    ..Default::default()
                },
                state: self.state.clone(),
                progress: self.progress.clone(),
                snapshot_bytes: self.snapshot_bytes,
                delta_bytes: self.delta_bytes,
                chain: self.links,
            },
        ));
    }

    /// Marks the run's thread as stopped (`failed`) so `retry()` continues it.
    pub fn release(&self, status: &str) -> CoreResult<()> {
        let Some(t) = self.thread.clone() else {
            return Ok(());
        };
        self.attempt
            .store()
            .transact(&mut |tx| tx.set_status(&t, status))
    }

    pub fn progress_json(&self) -> String {
        serde_json::to_string(&self.progress).unwrap_or_default()
    }

    pub fn state_json(&self) -> String {
        state_text(&self.state)
    }
}

impl Exec {
    fn scope_step(&self) -> i64 {
        self.scope
            .rsplit_once('@')
            .and_then(|(_, s)| s.parse().ok())
            .unwrap_or(self.step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::spec::{compile, Spec};
    use crate::graph::END;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{NewRun, Store};

    struct Temp(std::path::PathBuf);
    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn store() -> (Temp, Arc<dyn Store>) {
        let dir = std::env::temp_dir().join(format!("composeai-graph-{}", crate::ids::new_ulid()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = SqliteStore::open(&dir.join("runs.db").to_string_lossy()).unwrap();
        (Temp(dir), Arc::new(s))
    }

    fn graph(f: impl FnOnce(&mut Spec)) -> Arc<Graph> {
        let mut spec = Spec {
            name: "g".into(),
            ..Default::default()
        };
        f(&mut spec);
        Arc::new(compile(spec).unwrap())
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn edge(a: &str, b: &str) -> (String, String) {
        (a.into(), b.into())
    }

    fn open(g: &Arc<Graph>, store: &Arc<dyn Store>) -> GraphRun {
        let attempt = Attempt::start(
            store.clone(),
            NewRun {
                run_id: crate::ids::new_ulid(),
                trace_id: crate::ids::new_ulid(),
                kind: "graph".into(),
                name: "g".into(),
                ..Default::default()
            },
        )
        .unwrap();
        GraphRun::open(
            g.clone(),
            Arc::new(attempt),
            None,
            Some(State::new()),
            true,
            64,
            None,
        )
        .unwrap()
    }

    fn names(run: &mut GraphRun) -> Vec<String> {
        run.ready().unwrap().into_iter().map(|e| e.node).collect()
    }

    fn step(run: &mut GraphRun, outcomes: Vec<(&str, Outcome)>, labels: &[(&str, &str)]) -> String {
        let outcomes = outcomes
            .into_iter()
            .map(|(n, o)| (n.to_string(), o))
            .collect();
        run.ready().unwrap();
        run.finish(outcomes).unwrap();
        let labels = labels
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let status = run.schedule(labels).unwrap();
        run.commit(None).unwrap();
        status
    }

    fn none() -> Outcome {
        Outcome::Update(None)
    }

    #[test]
    fn fan_out_runs_together_and_a_join_waits_for_every_source() {
        let (_t, s) = store();
        let g = graph(|sp| {
            sp.nodes = strings(&["s", "a", "b", "b2", "j"]);
            sp.start = Some("s".into());
            sp.edges = vec![
                edge("s", "a"),
                edge("s", "b"),
                edge("b", "b2"),
                edge("j", END),
            ];
            sp.joins = vec![(strings(&["a", "b2"]), "j".into())];
        });
        let mut run = open(&g, &s);
        assert_eq!(names(&mut run), ["s"]);
        assert_eq!(step(&mut run, vec![("s", none())], &[]), "running");
        assert_eq!(names(&mut run), ["a", "b"]);
        step(&mut run, vec![("b", none()), ("a", none())], &[]);
        assert_eq!(names(&mut run), ["b2"], "the join still waits for b2");
        let reopened =
            GraphRun::open(g.clone(), run.attempt.clone(), None, None, false, 64, None).unwrap();
        assert_eq!(
            (
                reopened.progress.next.clone(),
                reopened.progress.joins.clone()
            ),
            (strings(&["b2"]), vec![strings(&["a"])]),
            "the stored checkpoint keeps the join's progress"
        );
        step(&mut run, vec![("b2", none())], &[]);
        assert_eq!(names(&mut run), ["j"]);
        assert_eq!(step(&mut run, vec![("j", none())], &[]), "completed");
        assert!(run.progress.joins.iter().all(Vec::is_empty));
    }

    #[test]
    fn routes_and_goto_choose_the_next_nodes_within_their_declarations() {
        let (_t, s) = store();
        let g = graph(|sp| {
            sp.nodes = strings(&["r", "x", "y"]);
            sp.start = Some("r".into());
            sp.routes = vec![("r".into(), vec![("go".into(), "x".into())])];
            sp.gotos = vec![("x".into(), strings(&["y", END]))];
            sp.edges = vec![edge("y", END)];
        });
        let mut run = open(&g, &s);
        run.ready().unwrap();
        run.finish(vec![("r".into(), none())]).unwrap();
        let err = run.schedule(vec![("r".into(), "nope".into())]).unwrap_err();
        assert!(matches!(err, CoreError::Graph { ref code, .. } if code == "route_unknown_label"));
        let mut run = open(&g, &s);
        step(&mut run, vec![("r", none())], &[("r", "go")]);
        assert_eq!(names(&mut run), ["x"]);
        run.ready().unwrap();
        let bad = Outcome::Goto {
            targets: strings(&["r"]),
            update: None,
        };
        let err = run.finish(vec![("x".into(), bad)]).unwrap_err();
        assert!(matches!(err, CoreError::Graph { ref code, .. } if code == "goto_undeclared"));
        let good = Outcome::Goto {
            targets: strings(&["y"]),
            update: None,
        };
        step(&mut run, vec![("x", good)], &[]);
        assert_eq!(names(&mut run), ["y"]);
    }

    #[test]
    fn a_suspended_node_waits_for_its_answer_and_keeps_its_scope() {
        let (_t, s) = store();
        let g = graph(|sp| {
            sp.nodes = strings(&["ask"]);
            sp.start = Some("ask".into());
            sp.edges = vec![edge("ask", END)];
        });
        let mut run = open(&g, &s);
        let pause = Outcome::Suspend {
            payload: json!({"q": 1}),
            update: None,
        };
        assert_eq!(step(&mut run, vec![("ask", pause)], &[]), "suspended");
        assert!(
            run.ready().unwrap().is_empty(),
            "nothing runs before the answer"
        );
        let err = run.answer(vec![("other".into(), "1".into())]).unwrap_err();
        assert!(matches!(err, CoreError::Graph { ref code, .. } if code == "resume_invalid"));
        run.answer(vec![("ask".into(), "\"yes\"".into())]).unwrap();
        let ready = run.ready().unwrap();
        assert_eq!(
            (
                ready[0].scope.as_str(),
                ready[0].resume.as_deref(),
                ready[0].attempt,
                ready[0].step
            ),
            ("ask@0", Some("\"yes\""), 2, 1)
        );
    }

    #[test]
    fn a_run_reopened_continues_from_its_last_checkpoint() {
        let (_t, s) = store();
        let g = graph(|sp| {
            sp.nodes = strings(&["a", "b"]);
            sp.start = Some("a".into());
            sp.edges = vec![edge("a", "b"), edge("b", END)];
        });
        let mut run = open(&g, &s);
        let mut update = State::new();
        update.insert("n".into(), json!(1));
        step(&mut run, vec![("a", Outcome::Update(Some(update)))], &[]);
        let again =
            GraphRun::open(g.clone(), run.attempt.clone(), None, None, false, 64, None).unwrap();
        assert_eq!(again.progress.next, ["b"]);
        assert_eq!(again.state["n"], json!(1));
        assert_eq!(again.progress.step, 1);
    }
}
