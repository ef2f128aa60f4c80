//! A graph's declared structure, its compile-time validation (EXT-26) and
//! its fingerprint (EXT-20).

use super::END;
use crate::error::{CoreError, CoreResult};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet, VecDeque};

/// The structure as the Python builder declared it, in declaration order.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Spec {
    pub name: String,
    pub nodes: Vec<String>,
    pub start: Option<String>,
    #[serde(default)]
    pub edges: Vec<(String, String)>,
    /// `(source, [(label, target)])`.
    #[serde(default)]
    pub routes: Vec<(String, Vec<(String, String)>)>,
    /// `(sources, target)`.
    #[serde(default)]
    pub joins: Vec<(Vec<String>, String)>,
    /// `(source, targets)`.
    #[serde(default)]
    pub gotos: Vec<(String, Vec<String>)>,
    /// `(state key, reducer name)`.
    #[serde(default)]
    pub reducers: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reducer {
    Replace,
    Append,
    UpsertById,
}

impl Reducer {
    fn parse(name: &str) -> Option<Reducer> {
        match name {
            "replace" => Some(Reducer::Replace),
            "append" => Some(Reducer::Append),
            "upsert_by_id" => Some(Reducer::UpsertById),
            _ => None,
        }
    }
}

/// One validation finding: `{"code", "message", "node"?}` in Python.
#[derive(Debug, Clone, PartialEq)]
pub struct Issue {
    pub code: &'static str,
    pub message: String,
    pub node: Option<String>,
}

impl Issue {
    pub fn to_json(&self) -> Value {
        let mut v = json!({"code": self.code, "message": self.message});
        if let Some(n) = &self.node {
            v["node"] = json!(n);
        }
        v
    }
}

/// A validated graph: node indexes resolved, ready to schedule.
#[derive(Debug)]
pub struct Graph {
    pub spec: Spec,
    pub index: HashMap<String, usize>,
    /// Edge targets per node (`None` = `END`).
    pub edges: Vec<Vec<Option<usize>>>,
    /// The route of each node: label -> target (`None` = `END`).
    pub routes: Vec<Option<HashMap<String, Option<usize>>>>,
    /// Joins: sources and target, and the joins each node is a source of.
    pub joins: Vec<(Vec<usize>, usize)>,
    pub joins_of: Vec<Vec<usize>>,
    /// Declared goto targets per node (`None` = `END`).
    pub gotos: Vec<Option<Vec<Option<usize>>>>,
    pub reducers: HashMap<String, Reducer>,
    pub start: usize,
    pub fingerprint: String,
}

fn fnv64(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A stable digest of the structure: nodes, edges, routes, joins, goto
/// declarations and reducers, each in a canonical order, so that the same
/// graph declared in another process (or in another order) matches.
pub fn fingerprint(spec: &Spec) -> String {
    // Node order stays: it is the merge order of a step's writes (EXT-23).
    let nodes = &spec.nodes;
    let mut edges = spec.edges.clone();
    edges.sort();
    let mut routes: Vec<(String, Vec<(String, String)>)> = spec
        .routes
        .iter()
        .map(|(s, r)| {
            let mut r = r.clone();
            r.sort();
            (s.clone(), r)
        })
        .collect();
    routes.sort();
    let mut joins: Vec<(Vec<String>, String)> = spec
        .joins
        .iter()
        .map(|(s, t)| {
            let mut s = s.clone();
            s.sort();
            (s, t.clone())
        })
        .collect();
    joins.sort();
    let mut gotos: Vec<(String, Vec<String>)> = spec
        .gotos
        .iter()
        .map(|(s, t)| {
            let mut t = t.clone();
            t.sort();
            (s.clone(), t)
        })
        .collect();
    gotos.sort();
    let mut reducers = spec.reducers.clone();
    reducers.sort();
    let canonical = json!([nodes, spec.start, edges, routes, joins, gotos, reducers]).to_string();
    let a = fnv64(0xcbf2_9ce4_8422_2325, canonical.as_bytes());
    let b = fnv64(0x84222325_cbf29ce4, canonical.as_bytes());
    format!("{a:016x}{b:016x}")
}

struct Checker<'a> {
    spec: &'a Spec,
    index: HashMap<String, usize>,
    issues: Vec<Issue>,
}

impl Checker<'_> {
    /// Resolves a target name (`END` allowed), recording an issue when unknown.
    fn target(&mut self, name: &str, what: &str) -> Option<Option<usize>> {
        if name == END {
            return Some(None);
        }
        self.node(name, what).map(Some)
    }

    fn node(&mut self, name: &str, what: &str) -> Option<usize> {
        match self.index.get(name) {
            Some(i) => Some(*i),
            None => {
                self.issues.push(Issue {
                    code: "unknown_node",
                    message: format!("{what} names unknown node '{name}'"),
                    node: Some(name.to_string()),
                });
                None
            }
        }
    }
}

/// Checks the whole structure and returns the compiled graph, or every
/// issue found (EXT-26).
pub fn compile(spec: Spec) -> Result<Graph, Vec<Issue>> {
    let n = spec.nodes.len();
    let mut index = HashMap::new();
    for (i, name) in spec.nodes.iter().enumerate() {
        index.insert(name.clone(), i);
    }
    let mut c = Checker {
        spec: &spec,
        index,
        issues: Vec::new(),
    };
    let start = match &c.spec.start {
        None => {
            c.issues.push(Issue {
                code: "no_start",
                message: "no start node: call start(name)".into(),
                node: None,
            });
            None
        }
        Some(s) => match c.index.get(s) {
            Some(i) => Some(*i),
            None => {
                c.issues.push(Issue {
                    code: "unknown_start",
                    message: format!("start names unknown node '{s}'"),
                    node: Some(s.clone()),
                });
                None
            }
        },
    };
    let mut edges: Vec<Vec<Option<usize>>> = vec![Vec::new(); n];
    let mut routes: Vec<Option<HashMap<String, Option<usize>>>> = vec![None; n];
    let mut gotos: Vec<Option<Vec<Option<usize>>>> = vec![None; n];
    let mut joins = Vec::new();
    let mut joins_of: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut forward = vec![false; n];

    for (s, t) in &c.spec.edges {
        let what = format!("edge '{s}' -> '{t}'");
        let src = c.node(s, &what);
        let tgt = c.target(t, &what);
        if let (Some(src), Some(tgt)) = (src, tgt) {
            if !edges[src].contains(&tgt) {
                edges[src].push(tgt);
            }
            forward[src] = true;
        }
    }
    for (s, table) in &c.spec.routes {
        let src = c.node(s, &format!("route from '{s}'"));
        let mut resolved = HashMap::new();
        for (label, t) in table {
            if let Some(tgt) = c.target(t, &format!("route '{s}' label '{label}'")) {
                resolved.insert(label.clone(), tgt);
            }
        }
        if let Some(src) = src {
            if routes[src].is_some() {
                c.issues.push(Issue {
                    code: "duplicate_route",
                    message: format!("node '{s}' has more than one route"),
                    node: Some(s.clone()),
                });
            } else if table.is_empty() {
                c.issues.push(Issue {
                    code: "empty_route",
                    message: format!("route from '{s}' has no labels"),
                    node: Some(s.clone()),
                });
            } else {
                routes[src] = Some(resolved);
                forward[src] = true;
            }
        }
    }
    for (sources, t) in &c.spec.joins {
        let what = format!("join {sources:?} -> '{t}'");
        let tgt = c.node(t, &what);
        let mut srcs = Vec::new();
        for s in sources {
            if let Some(i) = c.node(s, &what) {
                if !srcs.contains(&i) {
                    srcs.push(i);
                }
            }
        }
        if sources.is_empty() {
            c.issues.push(Issue {
                code: "empty_join",
                message: format!("join into '{t}' has no sources"),
                node: Some(t.clone()),
            });
        }
        if let Some(tgt) = tgt {
            if srcs.len() == sources.len() && !srcs.is_empty() {
                let id = joins.len();
                for s in &srcs {
                    joins_of[*s].push(id);
                    forward[*s] = true;
                }
                joins.push((srcs, tgt));
            }
        }
    }
    for (s, targets) in &c.spec.gotos {
        let what = format!("goto from '{s}'");
        let src = c.node(s, &what);
        let mut resolved = Vec::new();
        for t in targets {
            if let Some(tgt) = c.target(t, &what) {
                resolved.push(tgt);
            }
        }
        if let Some(src) = src {
            let entry = gotos[src].get_or_insert_with(Vec::new);
            for t in resolved {
                if !entry.contains(&t) {
                    entry.push(t);
                }
            }
            if !targets.is_empty() {
                forward[src] = true;
            }
        }
    }
    let mut reducers = HashMap::new();
    for (key, name) in &c.spec.reducers {
        match Reducer::parse(name) {
            Some(r) => {
                reducers.insert(key.clone(), r);
            }
            None => c.issues.push(Issue {
                code: "unknown_reducer",
                message: format!(
                    "state key '{key}': unknown reducer '{name}' (expected 'replace', 'append' \
                     or 'upsert_by_id')"
                ),
                node: None,
            }),
        }
    }
    for (i, name) in c.spec.nodes.iter().enumerate() {
        if !forward[i] {
            c.issues.push(Issue {
                code: "dead_end",
                message: format!(
                    "node '{name}' has no way forward: add an edge (to END to finish), a route, \
                     a join or a goto declaration"
                ),
                node: Some(name.clone()),
            });
        }
    }
    if let Some(start) = start {
        let mut seen = vec![false; n];
        let mut queue = VecDeque::from([start]);
        seen[start] = true;
        while let Some(i) = queue.pop_front() {
            let mut next: Vec<usize> = edges[i].iter().flatten().copied().collect();
            if let Some(r) = &routes[i] {
                next.extend(r.values().flatten().copied());
            }
            if let Some(g) = &gotos[i] {
                next.extend(g.iter().flatten().copied());
            }
            next.extend(joins_of[i].iter().map(|j| joins[*j].1));
            for t in next {
                if !seen[t] {
                    seen[t] = true;
                    queue.push_back(t);
                }
            }
        }
        for (i, name) in c.spec.nodes.iter().enumerate() {
            if !seen[i] {
                c.issues.push(Issue {
                    code: "unreachable",
                    message: format!("node '{name}' is unreachable from the start node"),
                    node: Some(name.clone()),
                });
            }
        }
    }
    let issues = std::mem::take(&mut c.issues);
    let index = std::mem::take(&mut c.index);
    if !issues.is_empty() {
        return Err(issues);
    }
    let fingerprint = fingerprint(&spec);
    Ok(Graph {
        start: start.unwrap_or(0),
        spec,
        index,
        edges,
        routes,
        joins,
        joins_of,
        gotos,
        reducers,
        fingerprint,
    })
}

/// Parses the builder's JSON declaration.
pub fn parse(spec_json: &str) -> CoreResult<Spec> {
    let spec: Spec = serde_json::from_str(spec_json)
        .map_err(|e| CoreError::Config(format!("invalid graph declaration: {e}")))?;
    let mut seen = HashSet::new();
    for n in &spec.nodes {
        if !seen.insert(n) {
            return Err(CoreError::Config(format!("duplicate node name '{n}'")));
        }
    }
    Ok(spec)
}

impl Graph {
    pub fn name_of(&self, i: usize) -> &str {
        &self.spec.nodes[i]
    }

    pub fn reducer(&self, key: &str) -> Reducer {
        self.reducers.get(key).copied().unwrap_or(Reducer::Replace)
    }

    pub fn node(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(nodes: &[&str]) -> Spec {
        Spec {
            name: "g".into(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn e(a: &str, b: &str) -> (String, String) {
        (a.into(), b.into())
    }

    #[test]
    fn a_linear_graph_compiles() {
        let mut s = spec(&["a", "b"]);
        s.start = Some("a".into());
        s.edges = vec![e("a", "b"), e("b", END)];
        let g = compile(s).unwrap();
        assert_eq!(g.edges[0], vec![Some(1)]);
        assert_eq!(g.edges[1], vec![None]);
        assert_eq!(g.fingerprint.len(), 32);
    }

    #[test]
    fn every_issue_is_reported_at_once() {
        let mut s = spec(&["a", "b", "c", "d"]);
        s.start = Some("a".into());
        s.edges = vec![e("a", "b"), e("b", "zzz"), e("d", END)];
        s.gotos = vec![("a".into(), vec!["nowhere".into()])];
        s.reducers = vec![("notes".into(), "concat".into())];
        let issues = compile(s).unwrap_err();
        let codes: Vec<(&str, Option<&str>)> =
            issues.iter().map(|i| (i.code, i.node.as_deref())).collect();
        assert!(codes.contains(&("unknown_node", Some("zzz"))), "{codes:?}");
        assert!(codes.contains(&("unknown_node", Some("nowhere"))));
        assert!(codes.contains(&("unknown_reducer", None)));
        assert!(codes.contains(&("dead_end", Some("b"))));
        assert!(codes.contains(&("dead_end", Some("c"))));
        assert!(codes.contains(&("unreachable", Some("c"))));
        assert!(codes.contains(&("unreachable", Some("d"))));
        assert!(!codes.contains(&("dead_end", Some("a"))));
    }

    #[test]
    fn a_missing_or_unknown_start_is_reported() {
        let mut s = spec(&["a"]);
        s.edges = vec![e("a", END)];
        assert_eq!(compile(s.clone()).unwrap_err()[0].code, "no_start");
        s.start = Some("x".into());
        assert_eq!(compile(s).unwrap_err()[0].code, "unknown_start");
    }

    #[test]
    fn routes_joins_and_gotos_count_as_ways_forward_and_reach_nodes() {
        let mut s = spec(&["a", "b", "c", "d", "e"]);
        s.start = Some("a".into());
        s.routes = vec![(
            "a".into(),
            vec![("x".into(), "b".into()), ("y".into(), "c".into())],
        )];
        s.joins = vec![(vec!["b".into(), "c".into()], "d".into())];
        s.gotos = vec![("d".into(), vec!["e".into(), END.into()])];
        s.edges = vec![e("e", END)];
        let g = compile(s).unwrap();
        assert_eq!(g.joins, vec![(vec![1, 2], 3)]);
        assert_eq!(g.joins_of[1], vec![0]);
    }

    #[test]
    fn the_fingerprint_ignores_edge_order_but_not_structure() {
        let mut a = spec(&["a", "b"]);
        a.start = Some("a".into());
        a.edges = vec![e("a", "b"), e("b", END)];
        let mut b = spec(&["a", "b"]);
        b.start = Some("a".into());
        b.edges = vec![e("b", END), e("a", "b")];
        assert_eq!(fingerprint(&a), fingerprint(&b));
        b.reducers = vec![("k".into(), "append".into())];
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn duplicate_nodes_are_refused_when_parsing() {
        let err = parse(r#"{"name":"g","nodes":["a","a"],"start":"a"}"#).unwrap_err();
        assert!(err.to_string().contains("duplicate node name 'a'"));
    }
}
