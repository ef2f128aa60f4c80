//! The per-attempt journal: replay keys, the in-memory snapshot loaded once
//! per attempt, and fencing of abandoned threads.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A step key `"<prefix>#<n>"` as its parts, the prefix shared by every key
/// of its series: a replayed step's key is never formatted on the path
/// that replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepKey {
    pub prefix: Arc<str>,
    pub n: u32,
}

impl StepKey {
    /// Appends the key's text to `out`.
    pub fn write_to(&self, out: &mut String) {
        use std::fmt::Write;
        out.push_str(&self.prefix);
        out.push('#');
        let _ = write!(out, "{}", self.n);
    }

    /// `key` as its parts, when it has the form of a counter's key.
    pub fn parse(key: &str) -> Option<StepKey> {
        split_key(key).map(|(prefix, n)| StepKey {
            prefix: Arc::from(prefix),
            n,
        })
    }
}

impl fmt::Display for StepKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.prefix, self.n)
    }
}

/// `key` split as `<prefix>#<n>`, `n` written as `format_key` writes a
/// counter (no sign, no leading zero, 1 to `u32::MAX`).
fn split_key(key: &str) -> Option<(&str, u32)> {
    let (prefix, digits) = key.rsplit_once('#')?;
    let canonical = !digits.is_empty()
        && digits.len() <= 10
        && !digits.starts_with('0')
        && digits.bytes().all(|b| b.is_ascii_digit());
    if !canonical {
        return None;
    }
    Some((prefix, digits.parse().ok()?))
}

/// The values of the keys `<prefix>#1`, `<prefix>#2`, …: slot `n - 1`,
/// and their identities (issue 27): as stored for a journaled value, as
/// this attempt called it for a key reserved and not yet journaled.
struct Series {
    prefix: Arc<str>,
    values: Vec<Option<Arc<str>>>,
    idents: Vec<Option<Ident>>,
}

/// A (scope, name) counter, the series its keys belong to, and its scope.
struct Counter {
    n: u32,
    series: usize,
    scope: usize,
}

/// The journaled calls of one scope by position: the steps stored with an
/// identity (`(series, n)` at `pos - 1`), and how many positions this
/// attempt has reserved.
#[derive(Default)]
struct ScopeCalls {
    text: Arc<str>,
    reserved: u32,
    recorded: Vec<Option<(usize, u32)>>,
    /// Whether a flow body makes this scope's calls (`owner_body`), once
    /// known: only those must replay alike (FLOW-21); a task's or a tool's
    /// body may call other steps differently on a new attempt.
    checked: Option<bool>,
    /// The openers' text this attempt journals with the scope's rows
    /// (`Ident::encode_with`), once computed.
    chain: Option<Option<Arc<str>>>,
    /// Whether the openers a stored row named were placed (`mark_openers`).
    openers_marked: bool,
}

/// What identifies a journaled step besides its key (issue 27): its
/// position among the journaled calls of its scope (call order, so a
/// reordered or removed call is seen even where keys still match), the
/// length of that scope in the key, its kind, and a hash of its arguments
/// (none where the step has no arguments or they cannot be encoded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ident {
    pub pos: u32,
    pub scope_len: u32,
    pub digest: Option<u64>,
    pub kind: Kind,
}

/// The kind of a journaled call: one of `KINDS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind(u8);

/// Every kind of journaled call the engine makes. A call of another kind
/// keeps no identity (it replays unchecked). A `map` or `aggregate` takes a
/// position without a row of its own (its items' and branches' rows name
/// it, `Ident::encode_with`); `patched` is a marker row (OPS-2).
const KINDS: [&str; 12] = [
    "task",
    "flow",
    "agent",
    "now",
    "random",
    "sleep",
    "receive",
    "receive_all",
    "await_until",
    "map",
    "aggregate",
    "patched",
];

impl Kind {
    pub fn of(name: &str) -> Option<Kind> {
        KINDS.iter().position(|k| *k == name).map(|i| Kind(i as u8))
    }

    pub fn name(self) -> &'static str {
        KINDS[self.0 as usize]
    }
}

impl Ident {
    /// The stored form, `<pos>:<scope length>:<digest hex or ->:<kind>`.
    pub fn encode(&self) -> String {
        let kind = self.kind.name();
        match self.digest {
            Some(d) => format!("{}:{}:{d:016x}:{kind}", self.pos, self.scope_len),
            None => format!("{}:{}:-:{kind}", self.pos, self.scope_len),
        }
    }

    /// `encode` followed by the openers of the row's scope (`chain`, see
    /// `ScopeCalls::chain`), when it has any.
    pub fn encode_with(&self, chain: Option<&str>) -> String {
        let mut text = self.encode();
        if let Some(chain) = chain {
            text.push(':');
            text.push_str(chain);
        }
        text
    }

    /// The stored form read back; `None` for anything else (the step is
    /// then replayed unchecked, like a journal written before identities).
    /// Read once per row of every resumed run: no allocation.
    pub fn parse(text: &str) -> Option<Ident> {
        Ident::parse_row(text).map(|(id, _)| id)
    }

    /// `parse`, with the openers' text that follows a nested scope's row.
    pub fn parse_row(text: &str) -> Option<(Ident, Option<&str>)> {
        fn number(part: &[u8]) -> Option<u32> {
            if part.is_empty() || part.len() > 9 {
                return None;
            }
            part.iter().try_fold(0u32, |n, &b| {
                b.is_ascii_digit().then(|| n * 10 + u32::from(b - b'0'))
            })
        }
        let mut parts = text.splitn(5, ':');
        let pos = number(parts.next()?.as_bytes())?;
        let scope_len = number(parts.next()?.as_bytes())?;
        let digest = match parts.next()? {
            "-" => None,
            hex if hex.len() == 16 => Some(u64::from_str_radix(hex, 16).ok()?),
            _ => return None,
        };
        let kind = Kind::of(parts.next()?)?;
        if pos == 0 {
            return None;
        }
        let id = Ident {
            pos,
            scope_len,
            digest,
            kind,
        };
        Some((id, parts.next()))
    }
}

/// One opener of a scope: the call, in the parent scope, whose body or
/// items make the scope's calls (`openers`).
struct Opener {
    /// The parent scope: `scope[..parent]`.
    parent: usize,
    /// The call's key prefix: `scope[..prefix]`.
    prefix: usize,
    n: u32,
}

/// The calls that open `scope`, outermost first: for `sub#1/map#2[0]`,
/// `sub#1` in the run's scope and `sub#1/map#2` in `sub#1`; an
/// `aggregate#k/<branch>` pair has one. Stops at a segment no positioned
/// call opens (a tool call's).
fn openers(scope: &str) -> Vec<Opener> {
    let mut out = Vec::new();
    let mut start = 0;
    let next_end = |from: usize| scope[from..].find('/').map_or(scope.len(), |i| from + i);
    while start < scope.len() {
        let end = next_end(start);
        let seg = &scope[start..end];
        let parent = start.saturating_sub(1);
        if let Some((name, n)) = split_key(seg) {
            out.push(Opener {
                parent,
                prefix: start + name.len(),
                n,
            });
            if name == "aggregate" && end < scope.len() {
                // The branch's name is part of this opener's scope.
                start = next_end(end + 1) + 1;
                continue;
            }
        } else if let Some((head, _)) = seg.strip_suffix(']').and_then(|s| s.split_once('[')) {
            match split_key(head) {
                Some(("map", n)) => out.push(Opener {
                    parent,
                    prefix: start + 3,
                    n,
                }),
                _ => break,
            }
        } else {
            break;
        }
        start = end + 1;
    }
    out
}

/// One opener as stored: `<kind>@<pos>` or `<kind>@<pos>=<digest hex>`.
fn parse_opener(text: &str) -> Option<(Kind, u32, Option<u64>)> {
    let (kind, rest) = text.split_once('@')?;
    let (pos, digest) = match rest.split_once('=') {
        Some((pos, hex)) => (pos, Some(u64::from_str_radix(hex, 16).ok()?)),
        None => (rest, None),
    };
    let pos: u32 = pos.parse().ok().filter(|&p| p > 0)?;
    Some((Kind::of(kind)?, pos, digest))
}

/// The name of a `patched` marker's keys (`patched#<n>`, OPS-2).
pub const PATCH: &str = "patched";

/// Where `Journal::patch` places a `patched` call.
#[derive(Debug, PartialEq, Eq)]
pub enum Patch {
    /// The journal holds this patch's marker at the call's position.
    Marked,
    /// A new marker, to journal under this key.
    New(StepKey),
    /// No marker, and none to journal: the call takes no position.
    Absent,
}

/// The call a step's reservation is made for.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub kind: &'a str,
    pub digest: Option<u64>,
}

/// The stable hash of a step's encoded arguments: SipHash-1-3 with fixed
/// keys, the same in every process and release.
pub fn digest(text: &str) -> u64 {
    use std::hash::Hasher;
    let mut h =
        siphasher::sip::SipHasher13::new_with_keys(0x636f_6d70_6f73_6561, 0x6964_656e_7469_7479);
    h.write(text.as_bytes());
    h.finish()
}

/// A fork's source journal (issue 27): the journal of the run forked, and
/// the key from which the fork executes.
pub struct ForkSource {
    pub journal: Journal,
    pub at: String,
}

/// Where a body's calls stopped matching its journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// The journaled step at the point of divergence.
    pub key: String,
    pub recorded: String,
    pub called: String,
}

fn describe(kind: &str, name: &str, key: &str) -> String {
    format!("{kind} '{name}' at '{key}'")
}

/// `describe`, with a `map`'s number of items (its digest).
fn describe_call(kind: Kind, name: &str, key: &str, digest: Option<u64>) -> String {
    let text = describe(kind.name(), name, key);
    match (kind.name(), digest) {
        ("map", Some(items)) => format!("{text} over {items} items"),
        _ => text,
    }
}

/// Slots a series may have for a journal of `len` values: a key far past
/// every other (a store written by hand) is kept by its text instead, so
/// memory stays linear in what is stored.
fn slot_limit(len: usize) -> usize {
    2 * len + 64
}

/// Journal state of one attempt: the stored values (loaded once, plus this
/// attempt's writes) and the per-(scope, name) key counters. Counter keys
/// are held by series, so a step finds its value by index without a key.
#[derive(Default)]
pub struct Journal {
    series: Vec<Series>,
    by_prefix: HashMap<Arc<str>, usize>,
    /// Keys of another form, and keys past their series' slot limit.
    other: HashMap<String, Arc<str>>,
    counters: HashMap<String, Counter>,
    /// Identities of keys held in `other`.
    other_idents: HashMap<String, Ident>,
    scopes: Vec<ScopeCalls>,
    scope_index: HashMap<Arc<str>, usize>,
    /// Reused to look a counter up without allocating its key.
    scratch: String,
    len: usize,
}

type Keyed = (usize, u32, Arc<str>, Option<Ident>, Option<Box<str>>);

/// Builds a `Journal` from stored rows in any order.
#[derive(Default)]
pub struct JournalLoader {
    journal: Journal,
    /// `(series, n, value, identity, openers)` of counter keys, placed once
    /// the total is known.
    keyed: Vec<Keyed>,
}

impl JournalLoader {
    pub fn push(&mut self, key: &str, value: &str) {
        self.push_step(key, value, None);
    }

    /// `push` of a row with its stored identity, if any.
    pub fn push_step(&mut self, key: &str, value: &str, ident: Option<&str>) {
        let j = &mut self.journal;
        match split_key(key) {
            Some((prefix, n)) => {
                let series = j.series_index(prefix);
                let parsed = ident.and_then(Ident::parse_row).filter(|(id, _)| {
                    let len = id.scope_len as usize;
                    len == 0 || (prefix.len() > len && prefix.as_bytes()[len] == b'/')
                });
                let (ident, chain) = match parsed {
                    Some((id, chain)) => (Some(id), chain.map(Box::from)),
                    None => (None, None),
                };
                self.keyed.push((series, n, Arc::from(value), ident, chain));
            }
            None => {
                j.other.insert(key.to_owned(), Arc::from(value));
            }
        }
    }

    pub fn finish(self) -> Journal {
        let JournalLoader { mut journal, keyed } = self;
        let limit = slot_limit(keyed.len() + journal.other.len());
        let mut last_scope: Option<(Arc<str>, usize)> = None;
        for (series, n, value, ident, chain) in keyed {
            let slot = n as usize - 1;
            if let Some(id) = &ident {
                if (id.pos as usize) <= limit {
                    // Rows of one scope come together: its index is looked up once.
                    let prefix = &journal.series[series].prefix;
                    let scope_text = &prefix[..id.scope_len as usize];
                    let scope = match &last_scope {
                        Some((text, at)) if **text == *scope_text => *at,
                        _ => {
                            let scope_text: Arc<str> = Arc::from(scope_text);
                            let at = journal.scope_of(&scope_text);
                            last_scope = Some((scope_text, at));
                            at
                        }
                    };
                    if let Some(chain) = chain {
                        if !journal.scopes[scope].openers_marked {
                            journal.scopes[scope].openers_marked = true;
                            let text = journal.scopes[scope].text.clone();
                            journal.mark_openers(&text, &chain, limit);
                        }
                    }
                    let recorded = &mut journal.scopes[scope].recorded;
                    let at = id.pos as usize - 1;
                    if recorded.len() <= at {
                        recorded.resize(at + 1, None);
                    }
                    recorded[at] = Some((series, n));
                }
            }
            let s = &mut journal.series[series];
            if slot < limit {
                if s.values.len() <= slot {
                    s.values.resize(slot + 1, None);
                }
                s.values[slot] = Some(value);
                if let Some(id) = ident {
                    if s.idents.len() <= slot {
                        s.idents.resize(slot + 1, None);
                    }
                    s.idents[slot] = Some(id);
                }
            } else {
                let key = StepKey {
                    prefix: s.prefix.clone(),
                    n,
                };
                if let Some(id) = ident {
                    journal.other_idents.insert(key.to_string(), id);
                }
                journal.other.insert(key.to_string(), value);
            }
        }
        journal.len = journal
            .series
            .iter()
            .map(|s| s.values.iter().filter(|v| v.is_some()).count())
            .sum::<usize>()
            + journal.other.len();
        journal
    }
}

/// `"<name>#<n>"`, prefixed by `"<scope>/"` inside a scope.
pub fn format_key(scope: &str, name: &str, n: u32) -> String {
    use std::fmt::Write;
    let mut key = String::with_capacity(scope.len() + name.len() + 12);
    push_prefix(&mut key, scope, name);
    key.push('#');
    let _ = write!(key, "{n}");
    key
}

/// The scope of the flow body whose calls land in `scope`: `scope` less
/// its trailing `map` items and `aggregate` branches (FLOW-15), or None
/// for a scope inside a tool call.
fn owner_body(scope: &str) -> Option<&str> {
    let mut s = scope;
    loop {
        if s.is_empty() {
            return Some(s);
        }
        let (parent, last) = s.rsplit_once('/').unwrap_or(("", s));
        if last.starts_with("tool:") {
            return None;
        }
        if last.starts_with("map#") && last.ends_with(']') {
            s = parent;
            continue;
        }
        let (grandparent, branch_of) = parent.rsplit_once('/').unwrap_or(("", parent));
        if split_key(branch_of).is_some_and(|(name, _)| name == "aggregate") {
            s = grandparent;
            continue;
        }
        return Some(s);
    }
}

/// Where a series' name starts in its prefix, after a scope of `scope_len`.
fn name_start(scope_len: u32) -> usize {
    if scope_len == 0 {
        0
    } else {
        scope_len as usize + 1
    }
}

fn push_prefix(out: &mut String, scope: &str, name: &str) {
    if !scope.is_empty() {
        out.push_str(scope);
        out.push('/');
    }
    out.push_str(name);
}

impl Journal {
    pub fn new(entries: Vec<(String, String)>) -> Journal {
        let mut loader = JournalLoader::default();
        for (k, v) in &entries {
            loader.push(k, v);
        }
        loader.finish()
    }

    /// A journal of stored rows `(key, value, identity)`.
    pub fn from_rows(rows: &[(String, String, Option<String>)]) -> Journal {
        let mut loader = JournalLoader::default();
        for (k, v, ident) in rows {
            loader.push_step(k, v, ident.as_deref());
        }
        loader.finish()
    }

    fn series_index(&mut self, prefix: &str) -> usize {
        if let Some(&i) = self.by_prefix.get(prefix) {
            return i;
        }
        let prefix: Arc<str> = Arc::from(prefix);
        self.series.push(Series {
            prefix: prefix.clone(),
            values: Vec::new(),
            idents: Vec::new(),
        });
        self.by_prefix.insert(prefix, self.series.len() - 1);
        self.series.len() - 1
    }

    fn scope_of(&mut self, scope: &str) -> usize {
        if let Some(&i) = self.scope_index.get(scope) {
            return i;
        }
        let text: Arc<str> = Arc::from(scope);
        self.scopes.push(ScopeCalls {
            text: text.clone(),
            ..ScopeCalls::default()
        });
        self.scope_index.insert(text, self.scopes.len() - 1);
        self.scopes.len() - 1
    }

    /// Places the calls that opened `scope` (stored with one of its rows as
    /// `chain`) at their positions in their parent scopes, where no row of
    /// their own is: a `map`, an `aggregate`, or a call still unfinished
    /// when the journal was written (a nested flow or an agent paused
    /// inside). A body that no longer makes such a call is then stopped at
    /// the call it makes in its place, before that call runs.
    fn mark_openers(&mut self, scope: &str, chain: &str, limit: usize) {
        for (op, text) in openers(scope).iter().zip(chain.split(',')) {
            let Some((kind, pos, digest)) = parse_opener(text) else {
                return;
            };
            if pos as usize > limit || op.n as usize > limit {
                return;
            }
            let series = self.series_index(&scope[..op.prefix]);
            let parent = self.scope_of(&scope[..op.parent]);
            let recorded = &mut self.scopes[parent].recorded;
            let at = pos as usize - 1;
            if recorded.len() <= at {
                recorded.resize(at + 1, None);
            }
            if recorded[at].is_none() {
                recorded[at] = Some((series, op.n));
            }
            let idents = &mut self.series[series].idents;
            let slot = op.n as usize - 1;
            if idents.len() <= slot {
                idents.resize(slot + 1, None);
            }
            if idents[slot].is_none() {
                idents[slot] = Some(Ident {
                    pos,
                    scope_len: op.parent as u32,
                    digest,
                    kind,
                });
            }
        }
    }

    /// The openers of scope `at` as its rows store them: each opener's
    /// kind, position and digest, outermost first (computed once).
    fn chain_of(&mut self, at: usize) -> Option<Arc<str>> {
        if let Some(chain) = &self.scopes[at].chain {
            return chain.clone();
        }
        use std::fmt::Write;
        let text = self.scopes[at].text.clone();
        let mut out = String::new();
        for op in openers(&text) {
            let Some(&series) = self.by_prefix.get(&text[..op.prefix]) else {
                break;
            };
            let Some(id) = self.ident_at(series, op.n) else {
                break;
            };
            if !out.is_empty() {
                out.push(',');
            }
            let _ = write!(out, "{}@{}", id.kind.name(), id.pos);
            if let Some(d) = id.digest {
                let _ = write!(out, "={d:x}");
            }
        }
        let chain = (!out.is_empty()).then(|| Arc::from(out));
        self.scopes[at].chain = Some(chain.clone());
        chain
    }

    /// Advances the counter of `name` in `scope` (call order, never
    /// completion order): its series, the new count and the scope.
    fn advance(&mut self, scope: &str, name: &str) -> (usize, u32, usize) {
        let mut counter_key = std::mem::take(&mut self.scratch);
        counter_key.clear();
        counter_key.push_str(scope);
        counter_key.push('\0');
        counter_key.push_str(name);
        let next = match self.counters.get_mut(counter_key.as_str()) {
            Some(c) => {
                c.n += 1;
                (c.series, c.n, c.scope)
            }
            None => {
                let mut prefix = String::with_capacity(scope.len() + name.len() + 1);
                push_prefix(&mut prefix, scope, name);
                let series = self.series_index(&prefix);
                let scope_at = self.scope_of(scope);
                self.counters.insert(
                    counter_key.clone(),
                    Counter {
                        n: 1,
                        series,
                        scope: scope_at,
                    },
                );
                (series, 1, scope_at)
            }
        };
        self.scratch = counter_key;
        next
    }

    /// Allocates the next key for `name` in `scope` (a scope of `map` or
    /// `aggregate`: not a journaled call, so it takes no position).
    pub fn next_key(&mut self, scope: &str, name: &str) -> String {
        let (series, n, _) = self.advance(scope, name);
        format_key("", &self.series[series].prefix, n)
    }

    /// `next_key` as its parts, with the journaled value, if any.
    pub fn next_step(&mut self, scope: &str, name: &str) -> (StepKey, Option<Arc<str>>) {
        let (key, hit, _) = self.next_call(scope, name, None, false);
        (key, hit)
    }

    /// `next_step` of a journaled call: the call takes the next position of
    /// its scope, and with `check` its identity is compared with the one
    /// stored at that position and under that key (issue 27). A miss keeps
    /// the call's identity for the commit that journals it.
    pub fn next_call(
        &mut self,
        scope: &str,
        name: &str,
        call: Option<Call<'_>>,
        check: bool,
    ) -> (StepKey, Option<Arc<str>>, Option<Divergence>) {
        let (series, n, scope_at) = self.advance(scope, name);
        let s = &self.series[series];
        let key = StepKey {
            prefix: s.prefix.clone(),
            n,
        };
        let slot = n as usize - 1;
        let hit = match s.values.get(slot) {
            Some(Some(v)) => Some(v.clone()),
            _ if self.other.is_empty() => None,
            _ => {
                let mut text = std::mem::take(&mut self.scratch);
                text.clear();
                key.write_to(&mut text);
                let hit = self.other.get(text.as_str()).cloned();
                self.scratch = text;
                hit
            }
        };
        let Some((call, kind)) = call.and_then(|c| Some((c, Kind::of(c.kind)?))) else {
            return (key, hit, None);
        };
        let calls = &mut self.scopes[scope_at];
        calls.reserved += 1;
        let pos = calls.reserved;
        let diverged = if check && self.scope_checked(scope_at) {
            self.diverges(
                scope_at,
                pos,
                series,
                &key,
                name,
                (kind, call.digest),
                hit.is_some(),
            )
        } else {
            None
        };
        if hit.is_none() {
            let ident = Ident {
                pos,
                scope_len: scope.len() as u32,
                digest: call.digest,
                kind,
            };
            let idents = &mut self.series[series].idents;
            if slot < slot_limit(self.len) {
                if idents.len() <= slot {
                    idents.resize(slot + 1, None);
                }
                idents[slot] = Some(ident);
            } else {
                self.other_idents.insert(key.to_string(), ident);
            }
        }
        (key, hit, diverged)
    }

    /// `patched(id)` (OPS-2) at the next position of `scope`, `digest` the
    /// hash of the patch id. Where the journal has this patch's marker at
    /// that position, the call takes it (`Marked`). Where it has another
    /// row there (or a row at a later position: a call made there did not
    /// journal), or where `deprecate`, the call takes nothing: no key, no
    /// position, so the calls after it keep the positions of a body
    /// without it (`Absent`). Where the scope's journal ends before it,
    /// the call takes the next key and position to journal a marker when
    /// `new_code` (`New`), else nothing (`Absent`).
    pub fn patch(&mut self, scope: &str, digest: u64, new_code: bool, deprecate: bool) -> Patch {
        let (series, n, scope_at) = self.advance(scope, PATCH);
        let kind = Kind::of(PATCH).expect("a known kind");
        let pos = self.scopes[scope_at].reserved + 1;
        let recorded = &self.scopes[scope_at].recorded;
        let at = pos as usize - 1;
        let outcome = match recorded.get(at) {
            Some(Some((s2, n2))) => {
                let marker = (*s2, *n2) == (series, n)
                    && matches!(
                        self.series[series].values.get(n as usize - 1),
                        Some(Some(_))
                    )
                    && self
                        .ident_at(series, n)
                        .is_some_and(|id| id.kind == kind && id.digest == Some(digest));
                if marker {
                    Patch::Marked
                } else {
                    Patch::Absent
                }
            }
            _ if deprecate || !new_code => Patch::Absent,
            _ if recorded.iter().skip(at).any(Option::is_some) => Patch::Absent,
            _ => {
                let ident = Ident {
                    pos,
                    scope_len: scope.len() as u32,
                    digest: Some(digest),
                    kind,
                };
                let slot = n as usize - 1;
                let idents = &mut self.series[series].idents;
                if slot < slot_limit(self.len) {
                    if idents.len() <= slot {
                        idents.resize(slot + 1, None);
                    }
                    idents[slot] = Some(ident);
                } else {
                    let key = StepKey {
                        prefix: self.series[series].prefix.clone(),
                        n,
                    };
                    self.other_idents.insert(key.to_string(), ident);
                }
                Patch::New(StepKey {
                    prefix: self.series[series].prefix.clone(),
                    n,
                })
            }
        };
        match outcome {
            Patch::Absent => self.retreat(scope),
            _ => self.scopes[scope_at].reserved += 1,
        }
        outcome
    }

    /// Undoes a `Patch::New` of `scope` that journals nothing after all.
    pub fn unpatch(&mut self, scope: &str) {
        self.retreat(scope);
        if let Some(&at) = self.scope_index.get(scope) {
            self.scopes[at].reserved -= 1;
        }
    }

    /// Takes back the last key `patch` allocated in `scope`.
    fn retreat(&mut self, scope: &str) {
        let mut counter_key = std::mem::take(&mut self.scratch);
        counter_key.clear();
        counter_key.push_str(scope);
        counter_key.push('\0');
        counter_key.push_str(PATCH);
        if let Some(c) = self.counters.get_mut(counter_key.as_str()) {
            c.n -= 1;
        }
        self.scratch = counter_key;
    }

    /// The stored identity of key `n` of `series`.
    fn ident_at(&self, series: usize, n: u32) -> Option<&Ident> {
        let s = &self.series[series];
        match s.idents.get(n as usize - 1) {
            Some(Some(id)) => Some(id),
            _ if self.other_idents.is_empty() => None,
            _ => {
                let key = StepKey {
                    prefix: s.prefix.clone(),
                    n,
                };
                self.other_idents.get(&key.to_string())
            }
        }
    }

    /// Whether the call at `pos` of a scope, under `key`, is not the one
    /// its journal recorded there: another step at that position (or a call
    /// that opened journaled scopes there), or the same key stored with
    /// another kind, position or arguments (a `map` over another number of
    /// items, an `aggregate` with other branches).
    #[allow(clippy::too_many_arguments)]
    fn diverges(
        &self,
        scope_at: usize,
        pos: u32,
        series: usize,
        key: &StepKey,
        name: &str,
        (kind, digest): (Kind, Option<u64>),
        hit: bool,
    ) -> Option<Divergence> {
        let called = || describe_call(kind, name, &key.to_string(), digest);
        if let Some(Some((s2, n2))) = self.scopes[scope_at].recorded.get(pos as usize - 1) {
            if (*s2, *n2) != (series, key.n) {
                return self.recorded_divergence(*s2, *n2, None, called());
            }
        }
        // Without a value, the identity is of a call that opened scopes
        // the journal holds (`mark_openers`).
        let id = self.ident_at(series, key.n)?;
        let args_differ = matches!((id.digest, digest), (Some(a), Some(b)) if a != b);
        if id.kind == kind && id.pos == pos && !args_differ {
            return None;
        }
        let hash = |d: Option<u64>| format!("{:08x}", d.unwrap_or(0) >> 32);
        let (recorded_tail, called_tail) = if id.kind != kind {
            (String::new(), String::new())
        } else if args_differ {
            match kind.name() {
                "map" => (String::new(), String::new()),
                "aggregate" => (
                    format!(" with branches #{}", hash(id.digest)),
                    format!(" with other branches #{}", hash(digest)),
                ),
                _ => (
                    format!(" with arguments #{}", hash(id.digest)),
                    format!(" with other arguments #{}", hash(digest)),
                ),
            }
        } else {
            (
                format!(" as journaled call {} of its scope", id.pos),
                format!(" as call {pos}"),
            )
        };
        let called = format!("{}{called_tail}", called());
        if hit {
            let recorded = describe(id.kind.name(), name, &key.to_string());
            return Some(Divergence {
                key: key.to_string(),
                recorded: format!("{recorded}{recorded_tail}"),
                called,
            });
        }
        // A `map` over fewer items is named at the first item it drops.
        let from = (kind.name() == "map" && args_differ).then(|| digest.unwrap_or(0));
        let mut d = self.recorded_divergence(series, key.n, from, called)?;
        d.recorded.push_str(&recorded_tail);
        Some(d)
    }

    /// The divergence at the journaled call `n` of `series`, where the body
    /// made `called` instead. A call with no row of its own (it opened
    /// journaled scopes) is named by the first journaled step under it
    /// (from `map` item `from_item` on, for a `map` over fewer items).
    fn recorded_divergence(
        &self,
        series: usize,
        n: u32,
        from_item: Option<u64>,
        called: String,
    ) -> Option<Divergence> {
        let opener = StepKey {
            prefix: self.series[series].prefix.clone(),
            n,
        };
        let id = self.ident_at(series, n)?;
        let name = &opener.prefix[name_start(id.scope_len)..];
        let opener_text = opener.to_string();
        let mut recorded = describe_call(id.kind, name, &opener_text, id.digest);
        let has_row = matches!(
            self.series[series].values.get(n as usize - 1),
            Some(Some(_))
        );
        let key = if has_row {
            opener_text
        } else {
            if !matches!(id.kind.name(), "map" | "aggregate") {
                recorded.push_str(", unfinished");
            }
            self.first_row_under(&opener_text, from_item)
                .unwrap_or(opener_text)
        };
        Some(Divergence {
            key,
            recorded,
            called,
        })
    }

    /// The first journaled step in the scopes `opener` opened (`map`
    /// items from `from_item` on), by item, scope and position.
    fn first_row_under(&self, opener: &str, from_item: Option<u64>) -> Option<String> {
        let mut best: Option<(u64, &str, u32, String)> = None;
        for calls in &self.scopes {
            let text = &*calls.text;
            let Some(rest) = text.strip_prefix(opener) else {
                continue;
            };
            let item = match rest.as_bytes().first() {
                None | Some(b'/') => 0,
                Some(b'[') => {
                    let digits = rest[1..].split(']').next().unwrap_or("");
                    match digits.parse::<u64>() {
                        Ok(i) => i,
                        Err(_) => continue,
                    }
                }
                _ => continue,
            };
            if from_item.is_some_and(|from| item < from) {
                continue;
            }
            for (at, entry) in calls.recorded.iter().enumerate() {
                let Some((s, n)) = *entry else {
                    continue;
                };
                if !matches!(self.series[s].values.get(n as usize - 1), Some(Some(_))) {
                    continue;
                }
                let better = match &best {
                    None => true,
                    Some((i, t, p, _)) => (item, text, at as u32) < (*i, *t, *p),
                };
                if better {
                    let key = StepKey {
                        prefix: self.series[s].prefix.clone(),
                        n,
                    };
                    best = Some((item, text, at as u32, key.to_string()));
                }
                break;
            }
        }
        best.map(|(_, _, _, key)| key)
    }

    /// Whether a flow body makes the calls of scope `at` (cached).
    fn scope_checked(&mut self, at: usize) -> bool {
        if let Some(checked) = self.scopes[at].checked {
            return checked;
        }
        let text = self.scopes[at].text.clone();
        let checked = owner_body(&text).is_some_and(|owner| self.is_flow_body(owner));
        self.scopes[at].checked = Some(checked);
        checked
    }

    /// Whether `scope` is the run's own body or a nested flow's.
    fn is_flow_body(&self, scope: &str) -> bool {
        if scope.is_empty() {
            return true;
        }
        let Some((prefix, n)) = split_key(scope) else {
            return false;
        };
        let Some(&series) = self.by_prefix.get(prefix) else {
            return false;
        };
        self.ident_at(series, n)
            .is_some_and(|id| id.kind == Kind::of("flow").expect("a known kind"))
    }

    /// Once the run's body returned: the first journaled call a flow body
    /// that ran in this attempt no longer made (a step of its own scope,
    /// or of a `map` item or `aggregate` branch it no longer dispatches).
    pub fn unreached(&mut self) -> Option<Divergence> {
        let root = self.scope_index.get("").copied();
        // The run's own scope first, then the others as loaded.
        let order: Vec<usize> = root
            .into_iter()
            .chain((0..self.scopes.len()).filter(|&at| Some(at) != root))
            .collect();
        let mut found = None;
        for at in order {
            if self.scopes[at].recorded.is_empty() || !self.scope_checked(at) {
                continue;
            }
            let text = self.scopes[at].text.clone();
            let owner = owner_body(&text).unwrap_or_default();
            let owner_ran = owner.is_empty()
                || self
                    .scope_index
                    .get(owner)
                    .is_some_and(|&o| self.scopes[o].reserved > 0);
            if !owner_ran {
                continue;
            }
            let calls = &self.scopes[at];
            found = calls
                .recorded
                .iter()
                .skip(calls.reserved as usize)
                .flatten()
                .next()
                .copied();
            if found.is_some() {
                break;
            }
        }
        let (series, n) = found?;
        self.recorded_divergence(
            series,
            n,
            None,
            "nothing: the body returned without making this call".into(),
        )
    }

    /// The identity to journal with `key`: this attempt's call, when it
    /// reserved the key and it holds no value yet, followed by the openers
    /// of its scope when it is nested.
    pub fn pending_ident(&mut self, key: &str) -> Option<String> {
        let (prefix, n) = split_key(key)?;
        let &s = self.by_prefix.get(prefix)?;
        let series = &self.series[s];
        if let Some(Some(_)) = series.values.get(n as usize - 1) {
            return None;
        }
        let id = match series.idents.get(n as usize - 1) {
            Some(Some(id)) => *id,
            _ => *self.other_idents.get(key)?,
        };
        if id.scope_len == 0 {
            return Some(id.encode());
        }
        let scope = &prefix[..id.scope_len as usize];
        let chain = match self.scope_index.get(scope) {
            Some(&at) => self.chain_of(at),
            None => None,
        };
        Some(id.encode_with(chain.as_deref()))
    }

    pub fn get(&self, key: &str) -> Option<Arc<str>> {
        if let Some((prefix, n)) = split_key(key) {
            if let Some(&s) = self.by_prefix.get(prefix) {
                if let Some(Some(v)) = self.series[s].values.get(n as usize - 1) {
                    return Some(v.clone());
                }
            }
        }
        self.other.get(key).cloned()
    }

    /// Records a committed value; an existing value wins.
    pub fn record(&mut self, key: &str, value: Arc<str>) -> Arc<str> {
        if let Some(existing) = self.other.get(key) {
            return existing.clone();
        }
        if let Some((prefix, n)) = split_key(key) {
            let slot = n as usize - 1;
            let limit = slot_limit(self.len);
            let series = match self.by_prefix.get(prefix) {
                Some(&s) => Some(s),
                None if slot < limit => Some(self.series_index(prefix)),
                None => None,
            };
            if let Some(s) = series {
                let values = &mut self.series[s].values;
                if slot < values.len() || slot < limit {
                    if values.len() <= slot {
                        values.resize(slot + 1, None);
                    }
                    if let Some(existing) = &values[slot] {
                        return existing.clone();
                    }
                    values[slot] = Some(value.clone());
                    self.len += 1;
                    return value;
                }
            }
        }
        self.len += 1;
        self.other.insert(key.to_owned(), value.clone());
        value
    }

    /// Whether a stored key starts with `prefix` (a look at every series,
    /// not every row).
    pub fn has_key_prefix(&self, prefix: &str) -> bool {
        self.by_prefix.keys().any(|k| k.starts_with(prefix))
            || self.other.keys().any(|k| k.starts_with(prefix))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Journal access of one thread of work. Revoking a fence (its stage timed
/// out or was cancelled) revokes every fence derived from it.
#[derive(Clone, Default)]
pub struct Fence {
    chain: Vec<Arc<AtomicBool>>,
}

impl Fence {
    pub fn root() -> Fence {
        Fence {
            chain: vec![Arc::new(AtomicBool::new(false))],
        }
    }

    /// A fence revoked with this one, and also on its own.
    pub fn child(&self) -> Fence {
        let mut chain = self.chain.clone();
        chain.push(Arc::new(AtomicBool::new(false)));
        Fence { chain }
    }

    pub fn revoke(&self) {
        if let Some(own) = self.chain.last() {
            own.store(true, Ordering::SeqCst);
        }
    }

    pub fn is_revoked(&self) -> bool {
        self.chain.iter().any(|f| f.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_count_per_scope_and_name() {
        let mut j = Journal::default();
        assert_eq!(j.next_key("", "fetch"), "fetch#1");
        assert_eq!(j.next_key("", "fetch"), "fetch#2");
        assert_eq!(j.next_key("", "now"), "now#1");
        assert_eq!(j.next_key("map#1[0]", "fetch"), "map#1[0]/fetch#1");
        assert_eq!(j.next_key("map#1[1]", "fetch"), "map#1[1]/fetch#1");
        assert_eq!(j.next_key("", "fetch"), "fetch#3");
    }

    #[test]
    fn scope_and_name_do_not_collide() {
        let mut j = Journal::default();
        assert_eq!(j.next_key("a", "b"), "a/b#1");
        assert_eq!(j.next_key("", "a/b"), "a/b#1");
        assert_eq!(j.next_key("a", "b"), "a/b#2");
    }

    #[test]
    fn first_write_wins() {
        let mut j = Journal::new(vec![("t#1".into(), "1".into())]);
        assert_eq!(&*j.record("t#1", Arc::from("2")), "1");
        assert_eq!(&*j.record("t#2", Arc::from("3")), "3");
        assert_eq!(j.get("t#2").as_deref(), Some("3"));
        assert_eq!(j.len(), 2);
    }

    #[test]
    fn stored_keys_load_in_any_order_and_replay_by_series() {
        // The store returns keys in text order: #1, #10, #100, #2, ...
        let mut rows: Vec<(String, String)> = (1..=150)
            .map(|n| (format!("inc#{n}"), n.to_string()))
            .collect();
        rows.sort();
        rows.push(("map#1[0]/fetch#1".into(), "\"a\"".into()));
        rows.push(("__interrupt__:go".into(), "true".into()));
        rows.push(("inc#0".into(), "zero".into()));
        rows.push(("inc#07".into(), "padded".into()));
        let mut j = Journal::new(rows);
        assert_eq!(j.len(), 154);
        for n in 1..=150u32 {
            let (key, hit) = j.next_step("", "inc");
            assert_eq!(key.to_string(), format!("inc#{n}"));
            assert_eq!(hit.as_deref(), Some(n.to_string().as_str()));
        }
        let (key, hit) = j.next_step("", "inc");
        assert_eq!((key.to_string(), hit), ("inc#151".to_string(), None));
        let (key, hit) = j.next_step("map#1[0]", "fetch");
        assert_eq!(key.to_string(), "map#1[0]/fetch#1");
        assert_eq!(hit.as_deref(), Some("\"a\""));
        assert_eq!(j.get("__interrupt__:go").as_deref(), Some("true"));
        assert_eq!(j.get("inc#0").as_deref(), Some("zero"));
        assert_eq!(j.get("inc#07").as_deref(), Some("padded"));
        assert_eq!(j.get("inc#7").as_deref(), Some("7"));
        assert_eq!(j.get("inc#151"), None);
    }

    #[test]
    fn keys_far_past_their_series_are_kept_by_text() {
        let mut j = Journal::new(vec![
            ("t#1".into(), "1".into()),
            ("t#4000000000".into(), "far".into()),
            ("t#99999999999".into(), "beyond u32".into()),
        ]);
        assert_eq!(j.len(), 3);
        assert_eq!(j.get("t#4000000000").as_deref(), Some("far"));
        assert_eq!(j.get("t#99999999999").as_deref(), Some("beyond u32"));
        assert_eq!(&*j.record("t#4000000000", Arc::from("x")), "far");
        assert_eq!(&*j.record("t#3000000000", Arc::from("y")), "y");
        assert_eq!(j.get("t#3000000000").as_deref(), Some("y"));
        assert_eq!(j.len(), 4);
        let (_, hit) = j.next_step("", "t");
        assert_eq!(hit.as_deref(), Some("1"));
        let (key, hit) = j.next_step("", "t");
        assert_eq!((key.n, hit), (2, None));
    }

    #[test]
    fn a_key_kept_by_text_is_found_once_its_series_reaches_it() {
        let mut j = Journal::default();
        assert_eq!(&*j.record("s#100", Arc::from("late")), "late");
        for n in 1..100u32 {
            let (key, hit) = j.next_step("", "s");
            assert_eq!(hit, None);
            j.record(&key.to_string(), Arc::from(n.to_string().as_str()));
        }
        assert_eq!(j.len(), 100);
        let (key, hit) = j.next_step("", "s");
        assert_eq!((key.n, hit.as_deref()), (100, Some("late")));
        assert_eq!(&*j.record("s#100", Arc::from("other")), "late");
        assert_eq!(j.get("s#42").as_deref(), Some("42"));
    }

    #[test]
    fn next_key_and_next_step_share_counters() {
        let mut j = Journal::new(vec![("a/b#2".into(), "2".into())]);
        assert_eq!(j.next_key("a", "b"), "a/b#1");
        let (key, hit) = j.next_step("", "a/b");
        assert_eq!((key.to_string(), hit), ("a/b#1".to_string(), None));
        let (key, hit) = j.next_step("a", "b");
        assert_eq!(key, StepKey::parse("a/b#2").unwrap());
        assert_eq!(hit.as_deref(), Some("2"));
        assert_eq!(StepKey::parse("a/b#02"), None);
        assert_eq!(StepKey::parse("a/b"), None);
    }

    fn task(digest: u64) -> Option<Call<'static>> {
        Some(Call {
            kind: "task",
            digest: Some(digest),
        })
    }

    /// The rows an attempt calling `calls` (scope, name, digest) in order
    /// journals, identities included.
    fn journaled(calls: &[(&str, &str, u64)]) -> Vec<(String, String, Option<String>)> {
        let mut j = Journal::default();
        calls
            .iter()
            .map(|(scope, name, d)| {
                let (key, hit, diverged) = j.next_call(scope, name, task(*d), true);
                assert_eq!((hit, diverged), (None, None));
                let key = key.to_string();
                let ident = j.pending_ident(&key);
                j.record(&key, Arc::from("1"));
                (key, "1".to_string(), ident)
            })
            .collect()
    }

    #[test]
    fn identities_round_trip_their_stored_form() {
        let id = Ident {
            pos: 3,
            scope_len: 8,
            digest: Some(0xdead_beef),
            kind: Kind::of("task").unwrap(),
        };
        assert_eq!(id.encode(), "3:8:00000000deadbeef:task");
        assert_eq!(Ident::parse(&id.encode()), Some(id));
        let none = Ident {
            pos: 1,
            scope_len: 0,
            digest: None,
            kind: Kind::of("now").unwrap(),
        };
        assert_eq!(Ident::parse(&none.encode()), Some(none));
        for bad in [
            "",
            "0:0:-:task",
            "1:0:xyz:task",
            "1:0:-:",
            "a:0:-:task",
            "1:0:-:nokind",
        ] {
            assert_eq!(Ident::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_same_calls_replay_without_divergence() {
        let rows = journaled(&[("", "a", 1), ("map#1[0]", "b", 2), ("", "a", 3)]);
        let mut j = Journal::from_rows(&rows);
        for (scope, name, d) in [("", "a", 1), ("map#1[0]", "b", 2), ("", "a", 3)] {
            let (_, hit, diverged) = j.next_call(scope, name, task(d), true);
            assert!(hit.is_some());
            assert_eq!(diverged, None);
        }
        assert_eq!(j.unreached(), None);
    }

    #[test]
    fn a_call_out_of_place_diverges_at_the_journaled_key() {
        let rows = journaled(&[("", "a", 1), ("", "b", 2)]);
        // Reordered: b first.
        let mut j = Journal::from_rows(&rows);
        let (_, _, d) = j.next_call("", "b", task(2), true);
        assert_eq!(d.unwrap().key, "a#1");
        // Other arguments at the same key.
        let mut j = Journal::from_rows(&rows);
        assert_eq!(j.next_call("", "a", task(1), true).2, None);
        let d = j.next_call("", "b", task(9), true).2.unwrap();
        assert_eq!(d.key, "b#1");
        assert!(d.recorded.contains("arguments"), "{d:?}");
        // Another kind under the same key.
        let mut j = Journal::from_rows(&rows);
        let flow = Some(Call {
            kind: "flow",
            digest: Some(1),
        });
        assert_eq!(j.next_call("", "a", flow, true).2.unwrap().key, "a#1");
        // Unchecked: the same calls go through.
        let mut j = Journal::from_rows(&rows);
        assert_eq!(j.next_call("", "b", task(2), false).2, None);
    }

    #[test]
    fn a_body_that_stops_short_leaves_journaled_calls_unreached() {
        let rows = journaled(&[("", "a", 1), ("", "b", 2), ("sub#1", "c", 3)]);
        let mut j = Journal::from_rows(&rows);
        j.next_call("", "a", task(1), true);
        assert_eq!(j.unreached().unwrap().key, "b#1");
        // A scope never entered (a replayed nested step's) is not checked.
        j.next_call("", "b", task(2), true);
        assert_eq!(j.unreached(), None);
    }

    /// Rows journaled by calls `(scope, name, kind)` in order.
    fn journaled_kinds(
        calls: &[(&str, &str, &'static str)],
    ) -> Vec<(String, String, Option<String>)> {
        let mut j = Journal::default();
        calls
            .iter()
            .map(|(scope, name, kind)| {
                let call = Some(Call { kind, digest: None });
                let key = j.next_call(scope, name, call, true).0.to_string();
                let ident = j.pending_ident(&key);
                j.record(&key, Arc::from("1"));
                (key, "1".to_string(), ident)
            })
            .collect()
    }

    #[test]
    fn only_flow_bodies_must_call_alike() {
        let rows = journaled_kinds(&[
            ("", "t", "task"),
            ("t#1", "x", "task"),
            ("", "sub", "flow"),
            ("sub#1", "y", "task"),
        ]);
        let mut j = Journal::from_rows(&rows);
        let task = |kind| Some(Call { kind, digest: None });
        // A task body (scope `t#1`) may call other steps on a new attempt.
        j.next_call("", "t", task("task"), true);
        assert_eq!(j.next_call("t#1", "other", task("task"), true).2, None);
        // A nested flow's body (scope `sub#1`) may not.
        j.next_call("", "sub", task("flow"), true);
        let d = j.next_call("sub#1", "other", task("task"), true).2.unwrap();
        assert_eq!(d.key, "sub#1/y#1");
    }

    #[test]
    fn a_map_item_no_longer_dispatched_is_unreached() {
        let rows = journaled(&[("map#1[0]", "f", 1), ("map#1[1]", "f", 2), ("", "g", 3)]);
        let mut j = Journal::from_rows(&rows);
        j.next_key("", "map");
        j.next_call("map#1[0]", "f", task(1), true);
        j.next_call("", "g", task(3), true);
        assert_eq!(j.unreached().unwrap().key, "map#1[1]/f#1");
        assert_eq!(
            owner_body("map#1[0]/aggregate#2/b/sub#1/map#3[4]"),
            Some("map#1[0]/aggregate#2/b/sub#1")
        );
        assert_eq!(owner_body("aggregate#1/a"), Some(""));
        assert_eq!(owner_body("tool:call_7"), None);
    }

    #[test]
    fn journals_without_identities_replay_unchecked() {
        let mut j = Journal::new(vec![("a#1".into(), "1".into()), ("b#1".into(), "2".into())]);
        assert_eq!(j.next_call("", "b", task(5), true).2, None);
        assert_eq!(j.next_call("", "a", task(5), true).2, None);
        assert_eq!(j.unreached(), None);
    }

    #[test]
    fn unkeyed_reservations_take_no_position() {
        let rows = journaled(&[("", "a", 1), ("", "b", 2)]);
        let mut j = Journal::from_rows(&rows);
        j.next_key("", "map");
        assert_eq!(j.next_call("", "a", task(1), true).2, None);
        j.next_step("", "__retry__");
        assert_eq!(j.next_call("", "b", task(2), true).2, None);
    }

    /// One call of `record_calls`: (scope, name, kind, digest).
    type At = (&'static str, &'static str, &'static str, u64);

    /// Rows journaled by `calls` in order; a `map`'s or an `aggregate`'s
    /// call journals no row of its own, and a nested flow's is unfinished.
    fn record_calls(calls: &[At]) -> Vec<(String, String, Option<String>)> {
        let mut j = Journal::default();
        let mut rows = Vec::new();
        for &(scope, name, kind, d) in calls {
            let call = Some(Call {
                kind,
                digest: Some(d),
            });
            let (key, hit, diverged) = j.next_call(scope, name, call, true);
            assert_eq!((hit, diverged), (None, None));
            if matches!(kind, "map" | "aggregate" | "flow") {
                continue;
            }
            let key = key.to_string();
            let ident = j.pending_ident(&key);
            j.record(&key, Arc::from("1"));
            rows.push((key, "1".to_string(), ident));
        }
        rows
    }

    fn call(kind: &'static str, digest: u64) -> Option<Call<'static>> {
        Some(Call {
            kind,
            digest: Some(digest),
        })
    }

    const MAPPED: [At; 4] = [
        ("", "map", "map", 2),
        ("map#1[0]", "f", "task", 1),
        ("map#1[1]", "f", "task", 2),
        ("", "g", "task", 3),
    ];

    #[test]
    fn rows_of_nested_scopes_name_the_calls_that_opened_them() {
        let rows = record_calls(&[
            ("", "a", "task", 1),
            ("", "sub", "flow", 7),
            ("sub#1", "map", "map", 3),
            ("sub#1/map#1[2]", "f", "task", 4),
        ]);
        assert_eq!(rows[0].2.as_deref(), Some("1:0:0000000000000001:task"));
        assert_eq!(
            rows[1].2.as_deref(),
            Some("1:14:0000000000000004:task:flow@2=7,map@1=3")
        );
        let (id, chain) = Ident::parse_row(rows[1].2.as_deref().unwrap()).unwrap();
        assert_eq!((id.pos, chain), (1, Some("flow@2=7,map@1=3")));
        // The unchanged body replays: `sub#1` (no row yet) and its map are
        // where the rows say they were called.
        let mut j = Journal::from_rows(&rows);
        assert_eq!(j.next_call("", "a", task(1), true).2, None);
        assert_eq!(j.next_call("", "sub", call("flow", 7), true).2, None);
        assert_eq!(j.next_call("sub#1", "map", call("map", 3), true).2, None);
        let (_, hit, d) = j.next_call("sub#1/map#1[2]", "f", task(4), true);
        assert_eq!((hit.is_some(), d), (true, None));
        assert_eq!(j.unreached(), None);
    }

    #[test]
    fn a_call_made_where_a_map_was_diverges_before_it_runs() {
        let rows = record_calls(&MAPPED);
        let mut j = Journal::from_rows(&rows);
        let d = j.next_call("", "g", task(3), true).2.unwrap();
        assert_eq!(d.key, "map#1[0]/f#1");
        assert!(
            d.recorded.contains("map 'map' at 'map#1' over 2 items"),
            "{d:?}"
        );
        assert!(d.called.contains("task 'g'"), "{d:?}");
    }

    #[test]
    fn a_map_over_other_items_diverges_at_the_map() {
        let rows = record_calls(&MAPPED);
        let mut j = Journal::from_rows(&rows);
        let d = j.next_call("", "map", call("map", 1), true).2.unwrap();
        assert_eq!(d.key, "map#1[1]/f#1");
        assert!(d.called.ends_with("over 1 items"), "{d:?}");
        let mut j = Journal::from_rows(&rows);
        let d = j.next_call("", "map", call("map", 3), true).2.unwrap();
        assert_eq!(d.key, "map#1");
        let mut j = Journal::from_rows(&rows);
        assert_eq!(j.next_call("", "map", call("map", 2), true).2, None);
    }

    #[test]
    fn an_unfinished_nested_flow_called_with_other_arguments_diverges() {
        let rows = record_calls(&[("", "sub", "flow", 7), ("sub#1", "b", "task", 1)]);
        let mut j = Journal::from_rows(&rows);
        let d = j.next_call("", "sub", call("flow", 8), true).2.unwrap();
        assert_eq!(d.key, "sub#1/b#1");
        assert!(d.recorded.contains("unfinished"), "{d:?}");
        assert!(d.called.contains("other arguments"), "{d:?}");
        // Removed: the body returns without it.
        let mut j = Journal::from_rows(&rows);
        assert_eq!(j.unreached().unwrap().key, "sub#1/b#1");
    }

    #[test]
    fn patched_marks_new_code_and_keeps_old_positions() {
        let id = digest("v2");
        // A new run journals the marker at the call's position.
        let mut j = Journal::default();
        j.next_call("", "a", task(1), true);
        let Patch::New(key) = j.patch("", id, true, false) else {
            panic!("a new marker")
        };
        assert_eq!(key.to_string(), "patched#1");
        let ident = j.pending_ident("patched#1").unwrap();
        assert!(ident.starts_with("2:0:"), "{ident}");
        j.record("patched#1", Arc::from("\"v2\""));
        j.next_call("", "b", task(2), true);
        let rows = vec![
            (
                "a#1".to_string(),
                "1".to_string(),
                Some("1:0:0000000000000001:task".into()),
            ),
            ("patched#1".to_string(), "\"v2\"".to_string(), Some(ident)),
            ("b#1".to_string(), "1".to_string(), j.pending_ident("b#1")),
        ];
        // Replayed: the marker answers, the next call keeps its position.
        let mut j = Journal::from_rows(&rows);
        j.next_call("", "a", task(1), true);
        assert_eq!(j.patch("", id, false, false), Patch::Marked);
        assert_eq!(j.next_call("", "b", task(2), true).2, None);
        // Deprecated: the marker is taken without being asked.
        let mut j = Journal::from_rows(&rows);
        j.next_call("", "a", task(1), true);
        assert_eq!(j.patch("", id, true, true), Patch::Marked);
        assert_eq!(j.next_call("", "b", task(2), true).2, None);
        // Another patch id at the marker's position takes nothing.
        let mut j = Journal::from_rows(&rows);
        j.next_call("", "a", task(1), true);
        assert_eq!(j.patch("", digest("v3"), true, false), Patch::Absent);
        assert_eq!(j.patch("", id, true, false), Patch::Marked);
        // An old run: another row at the position, or a journal that ends.
        let old = record_calls(&[("", "a", "task", 1), ("", "b", "task", 2)]);
        let mut j = Journal::from_rows(&old);
        j.next_call("", "a", task(1), true);
        assert_eq!(j.patch("", id, true, false), Patch::Absent);
        assert_eq!(j.next_call("", "b", task(2), true).2, None);
        assert_eq!(j.patch("", id, false, false), Patch::Absent);
        assert_eq!(j.patch("", id, true, true), Patch::Absent);
        let Patch::New(key) = j.patch("", id, true, false) else {
            panic!("past the journal of a run on this code")
        };
        assert_eq!(key.to_string(), "patched#1");
        assert_eq!(j.unreached(), None);
    }

    #[test]
    fn revoking_a_fence_revokes_its_children_only_downward() {
        let root = Fence::root();
        let child = root.child();
        let grandchild = child.child();
        let sibling = root.child();
        child.revoke();
        assert!(child.is_revoked());
        assert!(grandchild.is_revoked());
        assert!(!root.is_revoked());
        assert!(!sibling.is_revoked());
        root.revoke();
        assert!(sibling.is_revoked());
    }
}
