//! A write transaction on a store connection whose `BEGIN IMMEDIATE` and
//! `COMMIT` run on the writer's own prepared statements (`Statements`):
//! rusqlite's `Transaction` parses both on every use, and its statement
//! cache hashes each text on every lookup and return, which costs every
//! commit a measurable share of its time.

use crate::store::sqlite::statements::Statements;
use rusqlite::Connection;

pub struct WriteTx<'c> {
    conn: &'c Connection,
    open: bool,
}

impl<'c> WriteTx<'c> {
    pub fn immediate(
        conn: &'c Connection,
        statements: &mut Statements,
    ) -> rusqlite::Result<WriteTx<'c>> {
        statements.execute(conn, "BEGIN IMMEDIATE", |_| Ok(()))?;
        Ok(WriteTx { conn, open: true })
    }

    /// Commits; on failure the transaction is rolled back when dropped.
    pub fn commit(mut self, statements: &mut Statements) -> rusqlite::Result<()> {
        statements.execute(self.conn, "COMMIT", |_| Ok(()))?;
        self.open = false;
        Ok(())
    }
}

impl std::ops::Deref for WriteTx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        if self.open && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WriteTx;
    use crate::store::sqlite::statements::Statements;
    use rusqlite::Connection;

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_committed_transaction_keeps_its_writes_and_a_dropped_one_does_not() {
        let c = Connection::open_in_memory().unwrap();
        let mut statements = Statements::default();
        c.execute_batch("CREATE TABLE t(x)").unwrap();
        let tx = WriteTx::immediate(&c, &mut statements).unwrap();
        tx.execute("INSERT INTO t VALUES(1)", []).unwrap();
        tx.commit(&mut statements).unwrap();
        {
            let tx = WriteTx::immediate(&c, &mut statements).unwrap();
            tx.execute("INSERT INTO t VALUES(2)", []).unwrap();
        }
        assert_eq!(count(&c), 1);
        assert!(c.is_autocommit(), "the dropped transaction was rolled back");
        let tx = WriteTx::immediate(&c, &mut statements).unwrap();
        tx.execute("INSERT INTO t VALUES(3)", []).unwrap();
        tx.commit(&mut statements).unwrap();
        assert_eq!(count(&c), 2);
        statements.clear();
    }
}
