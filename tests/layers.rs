//! The layer check of `src/`: re-draws the file-level import graph from the
//! code and fails on an import that runs upward or on any import circle.
//!
//! Every `use` path, and every inline `crate::…`, `super::…` or `self::…`
//! path, counts as an import of the file that defines the module it names
//! (the longest prefix of the path that is a module). A `use` of a child
//! module by its bare name (`pub use sqlite::SqliteStore;` in a `mod.rs`)
//! counts too; `mod x;` declarations do not. Imports inside `#[cfg(test)]`
//! modules count like any other. The layers, bottom to top, are in
//! `LAYERS`; docs/architecture.md ("Rust layers") says the same in prose.
//!
//! It needs nothing but the standard library, so it also runs on its own:
//! `rustc --edition 2021 --test tests/layers.rs -o layers && ./layers --nocapture`
//! prints the circles and upward imports it finds, and the graph with
//! `LAYERS_GRAPH=1`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Each file's layer, by the first matching rule: a rule ending in `/`
/// matches a folder, any other rule one file (paths are relative to
/// `src/`). A file may import files of its own layer or below; the circles
/// check keeps imports within one layer acyclic.
const LAYERS: &[(&str, u32, &str)] = &[
    // Plain building blocks that know nothing of storage: ids, errors, time,
    // the engine clock and its wake-ups, this process's identity, the
    // shared async runtime.
    ("ids.rs", 0, "base"),
    ("error.rs", 0, "base"),
    ("time.rs", 0, "base"),
    ("clock.rs", 0, "base"),
    ("owner.rs", 0, "base"),
    ("outage.rs", 0, "base"),
    ("runtime.rs", 0, "base"),
    // Which SQLite library the engine calls, found at import; the SQLite
    // backend's VFS and the bindings use it.
    ("sqlite_lib.rs", 0, "base"),
    ("test_dir.rs", 0, "base"),
    // Backends, each in its own folder: they see the trait and the base only.
    ("store/sqlite/", 2, "backend"),
    ("store/postgres/", 2, "backend"),
    // The trait, its row types and sub-traits (`store/*.rs`), and the
    // journal's value types the trait hands back.
    ("store/", 1, "store trait"),
    ("journal.rs", 1, "store trait"),
    // The span tap (OpenTelemetry export) sees the trait's span rows only;
    // the engine hands it each finished span, the bindings set it.
    ("span_tap.rs", 1, "store trait"),
    // The engine over the trait.
    ("lease.rs", 3, "engine"),
    ("run/", 3, "engine"),
    ("budget.rs", 3, "engine"),
    ("trace.rs", 3, "engine"),
    // Features, through trait methods.
    ("durable/", 4, "feature"),
    ("graph/", 4, "feature"),
    ("queue/", 4, "feature"),
    ("schedule/", 4, "feature"),
    // The Python bindings on top.
    ("py/", 5, "bindings"),
    ("lib.rs", 6, "crate root"),
];

fn layer_of(rel: &str) -> (u32, &'static str) {
    for &(rule, layer, name) in LAYERS {
        let hit = if rule.ends_with('/') {
            rel.starts_with(rule)
        } else {
            rel == rule
        };
        if hit {
            return (layer, name);
        }
    }
    panic!("src/{rel} has no layer: add it to LAYERS in tests/layers.rs");
}

/// The source with comments, string and char literals blanked out (newlines
/// kept), so that braces and paths inside them are not read as code.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && next == Some(b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if (c == b'r' || c == b'b')
            && !prev_is_ident(b, i)
            && raw_string_start(b, i).is_some()
        {
            let (hashes, body) = raw_string_start(b, i).unwrap();
            for &x in &b[i..body] {
                blank(&mut out, x);
            }
            i = body;
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            while i < b.len() && !b[i..].starts_with(&close) {
                blank(&mut out, b[i]);
                i += 1;
            }
            let n = close.len().min(b.len() - i);
            out.extend(std::iter::repeat_n(b' ', n));
            i += n;
        } else if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\''); a lifetime has no closing quote.
            let end = if next == Some(b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                // A multi-byte char: find a closing quote within 5 bytes.
                (i + 2..(i + 6).min(b.len()))
                    .find(|&j| b[j] == b'\'' && next.is_some_and(|n| n >= 0x80))
            };
            match end {
                Some(e) => {
                    out.extend(std::iter::repeat_n(b' ', e + 1 - i));
                    i = e + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn prev_is_ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// At `r"`, `r#"`, `br"`…: the number of `#` and where the body starts.
fn raw_string_start(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if b[j] == b'b' {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j) == Some(&b'#') {
        hashes += 1;
        j += 1;
    }
    (b.get(j) == Some(&b'"')).then_some((hashes, j + 1))
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Path, // ::
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other(char),
}

fn tokens(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_alphabetic() || ch == '_' {
            let s = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(c[s..i].iter().collect()));
            continue;
        }
        if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Other('0'));
            continue;
        }
        i += 1;
        match ch {
            ':' if c.get(i) == Some(&':') => {
                i += 1;
                out.push(Tok::Path);
            }
            '{' => out.push(Tok::Open),
            '}' => out.push(Tok::Close),
            ',' => out.push(Tok::Comma),
            ';' => out.push(Tok::Semi),
            '*' => out.push(Tok::Star),
            c if c.is_whitespace() => {}
            c => out.push(Tok::Other(c)),
        }
    }
    out
}

/// Expands one use tree starting at `t[*i]` into full paths (a glob or
/// `self` names the module itself).
fn use_tree(t: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match t.get(*i) {
            Some(Tok::Ident(s)) if s == "self" && !prefix.is_empty() => {
                *i += 1;
            }
            Some(Tok::Ident(s)) if s == "as" => {
                *i += 2;
                out.push(path);
                return;
            }
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
            }
            Some(Tok::Path) => *i += 1,
            Some(Tok::Star) => {
                *i += 1;
                out.push(path);
                return;
            }
            Some(Tok::Open) => {
                *i += 1;
                loop {
                    match t.get(*i) {
                        Some(Tok::Close) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Comma) => *i += 1,
                        None => return,
                        _ => use_tree(t, i, &path, out),
                    }
                }
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

struct Crate {
    /// Module path (`store::sqlite`) -> file, inline modules included.
    modules: BTreeMap<Vec<String>, String>,
}

impl Crate {
    /// The file of the longest prefix of `path` that is a module.
    fn resolve(&self, path: &[String]) -> Option<&String> {
        (1..=path.len())
            .rev()
            .find_map(|n| self.modules.get(&path[..n]))
    }
}

fn module_path(rel: &str) -> Vec<String> {
    let no_ext = rel.trim_end_matches(".rs");
    let mut parts: Vec<String> = no_ext.split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod") | Some("lib")) {
        parts.pop();
    }
    parts
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether the tokens before `t[k]` (a `mod`) are `#[cfg(test)]`, with a
/// visibility in between.
fn cfg_test_before(t: &[Tok], k: usize) -> bool {
    let mut j = k;
    if j >= 1 && t[j - 1] == Tok::Other(')') {
        // `pub(crate)`, `pub(super)`
        if j >= 4 && t[j - 4] == Tok::Ident("pub".into()) {
            j -= 4;
        }
    } else if j >= 1 && t[j - 1] == Tok::Ident("pub".into()) {
        j -= 1;
    }
    let want = [
        Tok::Other('#'),
        Tok::Other('['),
        Tok::Ident("cfg".into()),
        Tok::Other('('),
        Tok::Ident("test".into()),
        Tok::Other(')'),
        Tok::Other(']'),
    ];
    j >= want.len() && t[j - want.len()..j] == want
}

/// Every file's imports: file -> {imported file -> whether only test code
/// imports it}.
fn import_graph(src: &Path) -> BTreeMap<String, BTreeMap<String, bool>> {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let mut texts = BTreeMap::new();
    let mut krate = Crate {
        modules: BTreeMap::new(),
    };
    for f in &files {
        let rel = f
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        krate.modules.insert(module_path(&rel), rel.clone());
        texts.insert(rel, tokens(&strip(&fs::read_to_string(f).unwrap())));
    }
    // Files declared `#[cfg(test)] mod x;` hold only test code.
    let mut test_files: BTreeSet<String> = BTreeSet::new();
    for (rel, t) in &texts {
        for (k, w) in t.windows(3).enumerate() {
            if let [Tok::Ident(m), Tok::Ident(name), Tok::Semi] = w {
                if m == "mod" && cfg_test_before(t, k) {
                    let mut p = module_path(rel);
                    p.push(name.clone());
                    if let Some(f) = krate.modules.get(&p) {
                        test_files.insert(f.clone());
                    }
                }
            }
        }
    }
    // Inline modules (`mod tests { … }`) belong to their file.
    for (rel, t) in &texts {
        for (k, w) in t.windows(3).enumerate() {
            if let [Tok::Ident(m), Tok::Ident(name), Tok::Open] = w {
                if m == "mod" && !(k > 0 && t[k - 1] == Tok::Path) {
                    let mut p = module_path(rel);
                    p.push(name.clone());
                    krate.modules.entry(p).or_insert_with(|| rel.clone());
                }
            }
        }
    }
    let mut graph: BTreeMap<String, BTreeMap<String, bool>> = BTreeMap::new();
    for (rel, t) in &texts {
        let edges = graph.entry(rel.clone()).or_default();
        let mut add = |f: &String, test: bool| {
            let e = edges.entry(f.clone()).or_insert(true);
            *e &= test;
        };
        let base = module_path(rel);
        // The module each brace depth is in (for `super::` inside inline
        // modules), and whether it is test code.
        let mut scope: Vec<(usize, Vec<String>, bool)> =
            vec![(0, base.clone(), test_files.contains(rel))];
        let mut depth = 0usize;
        let mut k = 0;
        while k < t.len() {
            let (here, test) = {
                let s = scope.last().unwrap();
                (s.1.clone(), s.2)
            };
            match &t[k] {
                Tok::Open => {
                    depth += 1;
                    if k >= 2 {
                        if let (Tok::Ident(m), Tok::Ident(name)) = (&t[k - 2], &t[k - 1]) {
                            if m == "mod" {
                                let mut p = here.clone();
                                p.push(name.clone());
                                scope.push((depth, p, test || cfg_test_before(t, k - 2)));
                            }
                        }
                    }
                    k += 1;
                }
                Tok::Close => {
                    if scope.len() > 1 && scope.last().unwrap().0 == depth {
                        scope.pop();
                    }
                    depth = depth.saturating_sub(1);
                    k += 1;
                }
                Tok::Ident(u) if u == "use" => {
                    k += 1;
                    let mut paths = Vec::new();
                    use_tree(t, &mut k, &[], &mut paths);
                    for p in paths {
                        if let Some(abs) = absolute(&krate, &here, &p, true) {
                            if let Some(f) = krate.resolve(&abs) {
                                add(f, test);
                            }
                        }
                    }
                }
                // An inline path from the crate, a parent, this module or a
                // child module (`driven::DrivenPool` beside `mod driven;`).
                Tok::Ident(s)
                    if t.get(k + 1) == Some(&Tok::Path)
                        && !(k > 0 && t[k - 1] == Tok::Path)
                        && (s == "crate" || s == "super" || s == "self" || {
                            let mut child = here.clone();
                            child.push(s.clone());
                            krate.modules.contains_key(&child)
                        }) =>
                {
                    let mut p = vec![s.clone()];
                    k += 1;
                    while t.get(k) == Some(&Tok::Path) {
                        match t.get(k + 1) {
                            Some(Tok::Ident(seg)) => {
                                p.push(seg.clone());
                                k += 2;
                            }
                            _ => break,
                        }
                    }
                    if let Some(abs) = absolute(&krate, &here, &p, true) {
                        if let Some(f) = krate.resolve(&abs) {
                            add(f, test);
                        }
                    }
                }
                _ => k += 1,
            }
        }
        edges.remove(rel);
    }
    graph
}

/// The import graph without the test flags.
fn plain(g: &BTreeMap<String, BTreeMap<String, bool>>) -> BTreeMap<String, BTreeSet<String>> {
    g.iter()
        .map(|(f, to)| (f.clone(), to.keys().cloned().collect()))
        .collect()
}

/// The backend folder a file is in, if any.
fn backend_of(rel: &str) -> Option<&'static str> {
    ["store/sqlite/", "store/postgres/"]
        .into_iter()
        .find(|b| rel.starts_with(b))
}

/// `p` as a path from the crate root, when it names something in the crate.
fn absolute(krate: &Crate, here: &[String], p: &[String], in_use: bool) -> Option<Vec<String>> {
    let first = p.first()?;
    let mut cur: Vec<String>;
    let mut rest = p;
    match first.as_str() {
        "crate" => {
            cur = Vec::new();
            rest = &p[1..];
        }
        "self" | "super" => {
            cur = here.to_vec();
            while let Some(s) = rest.first() {
                match s.as_str() {
                    "self" => rest = &rest[1..],
                    "super" => {
                        cur.pop()?;
                        rest = &rest[1..];
                    }
                    _ => break,
                }
            }
        }
        // A bare path in a `use` that names a child module.
        name if in_use => {
            let mut child = here.to_vec();
            child.push(name.to_string());
            if !krate.modules.contains_key(&child) {
                return None;
            }
            cur = here.to_vec();
        }
        _ => return None,
    }
    cur.extend(rest.iter().cloned());
    Some(cur)
}

/// The strongly connected components with more than one file (Tarjan).
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct St<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = St {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn src_dir() -> PathBuf {
    let root = option_env!("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    root.join("src")
}

#[test]
fn src_has_no_import_circle_and_no_upward_import() {
    let full = import_graph(&src_dir());
    let g = plain(&full);
    if std::env::var_os("LAYERS_GRAPH").is_some() {
        for (f, to) in &g {
            println!(
                "{f} -> {}",
                to.iter().cloned().collect::<Vec<_>>().join(" ")
            );
        }
    }
    let comps = circles(&g);
    let mut wrong = Vec::new();
    for (f, to) in &full {
        let (lf, nf) = layer_of(f);
        for (t, &test_only) in to {
            let (lt, nt) = layer_of(t);
            if lt > lf {
                wrong.push(format!("{f} ({nf}) imports {t} ({nt}), a higher layer"));
            }
            match (backend_of(f), backend_of(t)) {
                (Some(a), Some(b)) if a != b => {
                    wrong.push(format!("{f} imports {t}: one backend imports another"));
                }
                // The engine and the features reach storage through the
                // trait; their tests may pick a backend to run on.
                (None, Some(_)) if (3..=4).contains(&lf) && !test_only => {
                    wrong.push(format!("{f} ({nf}) imports {t} outside its tests"));
                }
                _ => {}
            }
        }
    }
    println!(
        "{} files, {} imports",
        g.len(),
        g.values().map(BTreeSet::len).sum::<usize>()
    );
    println!("circles ({}):", comps.len());
    for c in &comps {
        println!("  [{}] {}", c.len(), c.join(" "));
    }
    println!("imports against the layers ({}):", wrong.len());
    for u in &wrong {
        println!("  {u}");
    }
    assert!(
        comps.is_empty() && wrong.is_empty(),
        "src/ breaks its layers: see the lists above"
    );
}

#[test]
fn the_check_sees_every_kind_of_import() {
    let t = tokens(&strip(
        "use crate::a::{b::C, d, e::{self, F}};\n// use crate::zz;\nlet s = \"crate::yy::Q\";\n",
    ));
    let mut k = 1;
    let mut paths = Vec::new();
    use_tree(&t, &mut k, &[], &mut paths);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        paths,
        vec![
            s(&["crate", "a", "b", "C"]),
            s(&["crate", "a", "d"]),
            s(&["crate", "a", "e"]),
            s(&["crate", "a", "e", "F"])
        ]
    );
    assert!(!t.contains(&Tok::Ident("zz".into())) && !t.contains(&Tok::Ident("yy".into())));
    let g = BTreeMap::from([
        ("a.rs".to_string(), BTreeSet::from(["b.rs".to_string()])),
        ("b.rs".to_string(), BTreeSet::from(["a.rs".to_string()])),
        ("c.rs".to_string(), BTreeSet::from(["a.rs".to_string()])),
    ]);
    assert_eq!(circles(&g), vec![s(&["a.rs", "b.rs"])]);
}
