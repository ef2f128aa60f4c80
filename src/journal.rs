//! The per-attempt journal: replay keys, the in-memory snapshot loaded once
//! per attempt, and fencing of abandoned threads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Journal state of one attempt: the stored values (loaded once, plus this
/// attempt's writes) and the per-(scope, name) key counters.
#[derive(Default)]
pub struct Journal {
    values: HashMap<String, Arc<str>>,
    counters: HashMap<String, u32>,
    /// Reused to look a counter up without allocating its key.
    scratch: String,
}

/// `"<name>#<n>"`, prefixed by `"<scope>/"` inside a scope.
pub fn format_key(scope: &str, name: &str, n: u32) -> String {
    use std::fmt::Write;
    let mut key = String::with_capacity(scope.len() + name.len() + 12);
    if !scope.is_empty() {
        key.push_str(scope);
        key.push('/');
    }
    key.push_str(name);
    key.push('#');
    let _ = write!(key, "{n}");
    key
}

impl Journal {
    pub fn new(entries: Vec<(String, String)>) -> Journal {
        Journal {
            values: entries
                .into_iter()
                .map(|(k, v)| (k, Arc::from(v)))
                .collect(),
            counters: HashMap::new(),
            scratch: String::new(),
        }
    }

    /// Allocates the next key for `name` in `scope` (call order, never
    /// completion order).
    pub fn next_key(&mut self, scope: &str, name: &str) -> String {
        let counter_key = &mut self.scratch;
        counter_key.clear();
        counter_key.push_str(scope);
        counter_key.push('\0');
        counter_key.push_str(name);
        let n = match self.counters.get_mut(counter_key.as_str()) {
            Some(n) => {
                *n += 1;
                *n
            }
            None => {
                self.counters.insert(counter_key.clone(), 1);
                1
            }
        };
        format_key(scope, name, n)
    }

    pub fn get(&self, key: &str) -> Option<Arc<str>> {
        self.values.get(key).cloned()
    }

    /// Records a committed value; an existing value wins.
    pub fn record(&mut self, key: &str, value: Arc<str>) -> Arc<str> {
        self.values.entry(key.to_string()).or_insert(value).clone()
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
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
