//! Multi-row `INSERT ... VALUES (...),(...)` statements for SQLite: a run
//! of rows is written with as many 32-row statements as fit, then 8-row,
//! then 1-row ones, so a batch costs a few statement executions instead of
//! one per row, and only three texts per insert are ever prepared (each
//! kept in the writer's `Statements`).

use std::ops::Range;
use std::sync::OnceLock;

/// Rows per statement, largest first (ending in 1, so every run splits).
const CHUNKS: [usize; 3] = [32, 8, 1];

/// The chunks a run of rows at `run` is inserted in, in order: as many of
/// the largest size as fit, then the smaller ones.
pub(crate) fn chunks(run: Range<usize>) -> impl Iterator<Item = Range<usize>> {
    let end = run.end;
    let mut at = run.start;
    std::iter::from_fn(move || {
        let size = *CHUNKS.iter().find(|&&n| n <= end - at)?;
        at += size;
        Some(at - size..at)
    })
}

/// Where the run of rows that starts at `at` ends (the rows a chunk's
/// shared parameters fit): the first index after `at`, below `len`, whose
/// row `same` refuses.
pub(crate) fn run_end(at: usize, len: usize, mut same: impl FnMut(usize) -> bool) -> usize {
    let mut end = at + 1;
    while end < len && same(end) {
        end += 1;
    }
    end
}

/// A multi-row insert: `head` (up to `VALUES`), then `row` once per row.
/// In `row`, `?1` to `?{shared}` are parameters every row of a statement
/// shares, bound once, and `?#k` is the row's own k-th parameter (of
/// `per_row`): row `i` numbers it `base(i) + k`. The text of each chunk
/// size is built once per process.
pub(crate) struct MultiRow {
    head: &'static str,
    row: &'static str,
    shared: usize,
    per_row: usize,
    sql: OnceLock<[String; 3]>,
}

impl MultiRow {
    pub(crate) const fn new(
        head: &'static str,
        row: &'static str,
        shared: usize,
        per_row: usize,
    ) -> MultiRow {
        MultiRow {
            head,
            row,
            shared,
            per_row,
            sql: OnceLock::new(),
        }
    }

    /// The parameter number row `i`'s own parameters follow.
    pub(crate) fn base(&self, i: usize) -> usize {
        self.shared + i * self.per_row
    }

    /// The statement inserting `rows` rows, a size `chunks` yields.
    pub(crate) fn sql(&'static self, rows: usize) -> &'static str {
        let all = self.sql.get_or_init(|| CHUNKS.map(|n| self.build(n)));
        let i = CHUNKS.iter().position(|&n| n == rows);
        &all[i.expect("a chunk size")]
    }

    fn build(&self, rows: usize) -> String {
        let mut sql = String::from(self.head);
        for i in 0..rows {
            if i > 0 {
                sql.push(',');
            }
            let mut parts = self.row.split("?#");
            sql.push_str(parts.next().unwrap_or_default());
            for part in parts {
                let digits = part.bytes().take_while(u8::is_ascii_digit).count();
                let k: usize = part[..digits].parse().expect("?# takes a number");
                sql.push('?');
                sql.push_str(&(self.base(i) + k).to_string());
                sql.push_str(&part[digits..]);
            }
        }
        sql
    }
}

/// Every column of every row `sql` selects: what the tests of the
/// multi-row inserts compare with the rows of the general inserts.
#[cfg(test)]
pub(crate) fn stored_rows(
    conn: &rusqlite::Connection,
    sql: &str,
) -> Vec<Vec<rusqlite::types::Value>> {
    let mut st = conn.prepare(sql).unwrap();
    let n = st.column_count();
    st.query_map([], |r| (0..n).map(|i| r.get(i)).collect())
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_splits_into_the_largest_chunks_that_fit() {
        let sizes = |run| chunks(run).map(|c| c.len()).collect::<Vec<_>>();
        assert_eq!(sizes(5..88), [32, 32, 8, 8, 1, 1, 1]);
        assert_eq!(sizes(3..3), [0usize; 0]);
        let all: Vec<_> = chunks(5..88).flatten().collect();
        assert_eq!(all, (5..88).collect::<Vec<_>>());
    }

    #[test]
    fn a_run_ends_at_the_first_row_that_shares_less() {
        let rids = [4, 4, 4, 7, 7, 4];
        let end = |at: usize| run_end(at, rids.len(), |i| rids[i] == rids[at]);
        assert_eq!((end(0), end(3), end(5)), (3, 5, 6));
    }

    #[test]
    fn row_parameters_are_numbered_after_the_shared_ones() {
        static INSERT: MultiRow =
            MultiRow::new("INSERT INTO t(a, b, c) VALUES", "(?1,?#2,?#1)", 1, 2);
        let insert = &INSERT;
        assert_eq!(insert.sql(1), "INSERT INTO t(a, b, c) VALUES(?1,?3,?2)");
        assert!(insert
            .sql(8)
            .starts_with("INSERT INTO t(a, b, c) VALUES(?1,?3,?2),(?1,?5,?4),"));
        assert!(insert.sql(8).ends_with(",(?1,?17,?16)"));
        assert!(insert.sql(32).ends_with(",(?1,?65,?64)"));
        assert_eq!(insert.base(31), 63);
    }
}
