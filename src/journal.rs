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

/// The values of the keys `<prefix>#1`, `<prefix>#2`, …: slot `n - 1`.
struct Series {
    prefix: Arc<str>,
    values: Vec<Option<Arc<str>>>,
}

/// A (scope, name) counter and the series its keys belong to.
struct Counter {
    n: u32,
    series: usize,
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
    /// Reused to look a counter up without allocating its key.
    scratch: String,
    len: usize,
}

/// Builds a `Journal` from stored rows in any order.
#[derive(Default)]
pub struct JournalLoader {
    journal: Journal,
    /// `(series, n, value)` of counter keys, placed once the total is known.
    keyed: Vec<(usize, u32, Arc<str>)>,
}

impl JournalLoader {
    pub fn push(&mut self, key: &str, value: &str) {
        let j = &mut self.journal;
        match split_key(key) {
            Some((prefix, n)) => {
                let series = j.series_index(prefix);
                self.keyed.push((series, n, Arc::from(value)));
            }
            None => {
                j.other.insert(key.to_owned(), Arc::from(value));
            }
        }
    }

    pub fn finish(self) -> Journal {
        let JournalLoader { mut journal, keyed } = self;
        let limit = slot_limit(keyed.len() + journal.other.len());
        for (series, n, value) in keyed {
            let slot = n as usize - 1;
            let s = &mut journal.series[series];
            if slot < limit {
                if s.values.len() <= slot {
                    s.values.resize(slot + 1, None);
                }
                s.values[slot] = Some(value);
            } else {
                let key = StepKey {
                    prefix: s.prefix.clone(),
                    n,
                };
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

    fn series_index(&mut self, prefix: &str) -> usize {
        if let Some(&i) = self.by_prefix.get(prefix) {
            return i;
        }
        let prefix: Arc<str> = Arc::from(prefix);
        self.series.push(Series {
            prefix: prefix.clone(),
            values: Vec::new(),
        });
        self.by_prefix.insert(prefix, self.series.len() - 1);
        self.series.len() - 1
    }

    /// Advances the counter of `name` in `scope` (call order, never
    /// completion order): its series and the new count.
    fn advance(&mut self, scope: &str, name: &str) -> (usize, u32) {
        let mut counter_key = std::mem::take(&mut self.scratch);
        counter_key.clear();
        counter_key.push_str(scope);
        counter_key.push('\0');
        counter_key.push_str(name);
        let next = match self.counters.get_mut(counter_key.as_str()) {
            Some(c) => {
                c.n += 1;
                (c.series, c.n)
            }
            None => {
                let mut prefix = String::with_capacity(scope.len() + name.len() + 1);
                push_prefix(&mut prefix, scope, name);
                let series = self.series_index(&prefix);
                self.counters
                    .insert(counter_key.clone(), Counter { n: 1, series });
                (series, 1)
            }
        };
        self.scratch = counter_key;
        next
    }

    /// Allocates the next key for `name` in `scope`.
    pub fn next_key(&mut self, scope: &str, name: &str) -> String {
        let (series, n) = self.advance(scope, name);
        format_key("", &self.series[series].prefix, n)
    }

    /// `next_key` as its parts, with the journaled value, if any.
    pub fn next_step(&mut self, scope: &str, name: &str) -> (StepKey, Option<Arc<str>>) {
        let (series, n) = self.advance(scope, name);
        let s = &self.series[series];
        let key = StepKey {
            prefix: s.prefix.clone(),
            n,
        };
        let hit = match s.values.get(n as usize - 1) {
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
        (key, hit)
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
