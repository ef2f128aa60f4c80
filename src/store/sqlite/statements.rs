//! The writer connection's insert statements, run without rusqlite's
//! statement cache or its copies of bound values (see `Statements`).

use crate::ids::StoredId;
use crate::store::sqlite::multirow::MultiRow;
use rusqlite::{ffi, Connection};
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int};
use std::ptr::{self, NonNull};

/// The writer's insert statements, prepared once on its connection and
/// kept here rather than in rusqlite's statement cache: for a 32-row insert
/// the cache's lookup and return hash and compare the whole text (over a
/// kilobyte) on every execution, and rusqlite's binds copy every text and
/// blob, together more per row than SQLite's own insert of it. Values are
/// bound here for the execution only, without a copy.
///
/// A connection with statements left open does not close: `clear` them
/// first (`Writer` declares this before its connection, so dropping it
/// does too).
pub struct Statements {
    db: *mut ffi::sqlite3,
    /// By the address and length of the statement's (static) text.
    prepared: Vec<((*const u8, usize), NonNull<ffi::sqlite3_stmt>)>,
}

// SAFETY: the statements are used only with their own connection and only
// through `&mut self` (under the store's writer lock), as the connection is.
unsafe impl Send for Statements {}

impl Default for Statements {
    fn default() -> Statements {
        Statements {
            db: ptr::null_mut(),
            prepared: Vec::new(),
        }
    }
}

impl Drop for Statements {
    fn drop(&mut self) {
        self.clear();
    }
}

impl Statements {
    /// Finalizes every statement.
    pub fn clear(&mut self) {
        for (_, st) in self.prepared.drain(..) {
            // SAFETY: a statement prepared here and not finalized yet.
            unsafe { ffi::sqlite3_finalize(st.as_ptr()) };
        }
    }

    /// Runs `insert`'s statement of `rows` rows on `conn` with the values
    /// `bind` gives it; the number of rows inserted.
    pub(crate) fn execute_rows<'a>(
        &mut self,
        conn: &Connection,
        insert: &'static MultiRow,
        rows: usize,
        bind: impl FnOnce(&mut Params<'a>) -> rusqlite::Result<()>,
    ) -> rusqlite::Result<usize> {
        self.execute(conn, insert.sql(rows), bind)
    }

    /// Runs `sql` on `conn` with the values `bind` gives it; the number of
    /// rows changed.
    pub fn execute<'a>(
        &mut self,
        conn: &Connection,
        sql: &'static str,
        bind: impl FnOnce(&mut Params<'a>) -> rusqlite::Result<()>,
    ) -> rusqlite::Result<usize> {
        let st = self.statement(conn, sql)?;
        let mut params = Params {
            st: st.as_ptr(),
            db: self.db,
            values: PhantomData,
        };
        let done = bind(&mut params).and_then(|()| {
            // SAFETY: a prepared statement of this connection, every value
            // it was given alive (borrowed for 'a) until the reset below.
            match unsafe { ffi::sqlite3_step(st.as_ptr()) } {
                ffi::SQLITE_DONE => Ok(unsafe { ffi::sqlite3_changes(self.db) } as usize),
                rc => Err(failure(self.db, rc)),
            }
        });
        // SAFETY: as above; afterwards it holds no pointer to the values.
        unsafe {
            ffi::sqlite3_reset(st.as_ptr());
            ffi::sqlite3_clear_bindings(st.as_ptr());
        }
        done
    }

    fn statement(
        &mut self,
        conn: &Connection,
        sql: &'static str,
    ) -> rusqlite::Result<NonNull<ffi::sqlite3_stmt>> {
        // SAFETY: only used to prepare statements on the connection and to
        // tell it from another one.
        let db = unsafe { conn.handle() };
        if db != self.db {
            self.clear();
            self.db = db;
        }
        let key = (sql.as_ptr(), sql.len());
        if let Some((_, st)) = self.prepared.iter().find(|(k, _)| *k == key) {
            return Ok(*st);
        }
        let mut st = ptr::null_mut();
        // SAFETY: `sql` is valid for its length (a `String`'s bytes, no NUL
        // needed when the length is given), `db` an open connection.
        let rc = unsafe {
            ffi::sqlite3_prepare_v2(
                db,
                sql.as_ptr() as *const c_char,
                sql.len() as c_int,
                &mut st,
                ptr::null_mut(),
            )
        };
        match NonNull::new(st) {
            Some(st) if rc == ffi::SQLITE_OK => {
                self.prepared.push((key, st));
                Ok(st)
            }
            _ => Err(failure(db, rc)),
        }
    }
}

/// The error of a failed call on `db`, with SQLite's message.
fn failure(db: *mut ffi::sqlite3, rc: c_int) -> rusqlite::Error {
    // SAFETY: `db` is open; the message is copied before any other call.
    let message = unsafe {
        let text = ffi::sqlite3_errmsg(db);
        (!text.is_null()).then(|| {
            std::ffi::CStr::from_ptr(text)
                .to_string_lossy()
                .into_owned()
        })
    };
    rusqlite::Error::SqliteFailure(ffi::Error::new(rc), message)
}

/// The parameters of one execution: a value bound here is borrowed until
/// the statement has run.
pub struct Params<'a> {
    st: *mut ffi::sqlite3_stmt,
    db: *mut ffi::sqlite3,
    values: PhantomData<&'a ()>,
}

impl<'a> Params<'a> {
    /// Binds `value` to parameter `i` (numbered from 1): a number, or a
    /// reference to what outlives the execution (`Copy` keeps out owned
    /// values, which would be gone before it).
    pub fn set<T: Bind + Copy + 'a>(&mut self, i: usize, value: T) -> rusqlite::Result<()> {
        // SAFETY: `st` is prepared; what `value` borrows outlives the
        // execution, and a number is copied by the bind.
        match unsafe { value.bind(self.st, i as c_int) } {
            ffi::SQLITE_OK => Ok(()),
            rc => Err(failure(self.db, rc)),
        }
    }
}

/// A value that binds to a parameter, texts and blobs without a copy.
///
/// # Safety
/// An implementation binds either a copy of the value (a number) or data
/// the value borrows, never bytes stored in the value itself: `Params::set`
/// takes values by copy.
pub unsafe trait Bind {
    /// # Safety
    /// `st` is a prepared statement; what `self` borrows stays alive and
    /// unchanged until it has run and been reset.
    unsafe fn bind(&self, st: *mut ffi::sqlite3_stmt, i: c_int) -> c_int;
}

// SAFETY: bound by value.
unsafe impl Bind for i64 {
    unsafe fn bind(&self, st: *mut ffi::sqlite3_stmt, i: c_int) -> c_int {
        ffi::sqlite3_bind_int64(st, i, *self)
    }
}

// SAFETY: bound by value (as 0 or 1, as rusqlite stores it).
unsafe impl Bind for bool {
    unsafe fn bind(&self, st: *mut ffi::sqlite3_stmt, i: c_int) -> c_int {
        ffi::sqlite3_bind_int64(st, i, i64::from(*self))
    }
}

// SAFETY: bound by value.
unsafe impl Bind for f64 {
    unsafe fn bind(&self, st: *mut ffi::sqlite3_stmt, i: c_int) -> c_int {
        ffi::sqlite3_bind_double(st, i, *self)
    }
}

// SAFETY: unsized, so only bound through a reference to it.
unsafe impl Bind for str {
    unsafe fn bind(&self, st: *mut ffi::sqlite3_stmt, i: c_int) -> c_int {
        ffi::sqlite3_bind_text64(
            st,
            i,
            self.as_ptr() as *const c_char,
            self.len() as u64,
            ffi::SQLITE_STATIC(),
            ffi::SQLITE_UTF8 as u8,
        )
    }
}

// SAFETY: unsized, so only bound through a reference to it.
unsafe impl Bind for [u8] {
    unsafe fn bind(&self, st: *mut ffi::sqlite3_stmt, i: c_int) -> c_int {
        ffi::sqlite3_bind_blob64(
            st,
            i,
            self.as_ptr() as *const _,
            self.len() as u64,
            ffi::SQLITE_STATIC(),
        )
    }
}

// SAFETY: not `Copy`, so only bound through a reference to it.
unsafe impl Bind for StoredId {
    unsafe fn bind(&self, st: *mut ffi::sqlite3_stmt, i: c_int) -> c_int {
        match self {
            StoredId::Bytes(b) => b[..].bind(st, i),
            StoredId::Text(t) => t.as_str().bind(st, i),
        }
    }
}

// SAFETY: binds what the reference points to.
unsafe impl<T: Bind + ?Sized> Bind for &T {
    unsafe fn bind(&self, st: *mut ffi::sqlite3_stmt, i: c_int) -> c_int {
        (**self).bind(st, i)
    }
}

// SAFETY: binds NULL or as `T` does.
unsafe impl<T: Bind> Bind for Option<T> {
    unsafe fn bind(&self, st: *mut ffi::sqlite3_stmt, i: c_int) -> c_int {
        match self {
            Some(v) => v.bind(st, i),
            None => ffi::sqlite3_bind_null(st, i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::multirow::stored_rows;

    static PAIRS: MultiRow = MultiRow::new("INSERT INTO t(k, a, b) VALUES", "(?1,?#1,?#2)", 1, 2);

    fn table() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t(k INTEGER NOT NULL, a, b NOT NULL)")
            .unwrap();
        conn
    }

    #[test]
    fn statements_store_each_value_as_bound() {
        let conn = table();
        let mut statements = Statements::default();
        let id = StoredId::Bytes([7; 16]);
        let text_id = StoredId::Text("call_7".into());
        let texts = ["x".repeat(3), String::new()];
        let none: Option<&str> = None;
        let inserted = statements
            .execute_rows(&conn, &PAIRS, 8, |p| {
                p.set(1, 5i64)?;
                p.set(PAIRS.base(0) + 1, 1.5f64)?;
                p.set(PAIRS.base(0) + 2, texts[0].as_str())?;
                p.set(PAIRS.base(1) + 1, none)?;
                p.set(PAIRS.base(1) + 2, texts[1].as_str())?;
                p.set(PAIRS.base(2) + 1, &id)?;
                p.set(PAIRS.base(2) + 2, &[][..] as &[u8])?;
                p.set(PAIRS.base(3) + 1, &text_id)?;
                p.set(PAIRS.base(3) + 2, Some(-3i64))?;
                for i in 4..8 {
                    p.set(PAIRS.base(i) + 1, &[1u8, 2][..])?;
                    p.set(PAIRS.base(i) + 2, i as i64)?;
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(inserted, 8);
        use rusqlite::types::Value::*;
        let rows = stored_rows(&conn, "SELECT k, a, b FROM t ORDER BY rowid");
        assert_eq!(rows[0], [Integer(5), Real(1.5), Text("xxx".into())]);
        assert_eq!(rows[1], [Integer(5), Null, Text(String::new())]);
        assert_eq!(rows[2], [Integer(5), Blob(vec![7; 16]), Blob(vec![])]);
        assert_eq!(rows[3], [Integer(5), Text("call_7".into()), Integer(-3)]);
        assert_eq!(rows[7], [Integer(5), Blob(vec![1, 2]), Integer(7)]);
    }

    #[test]
    fn a_failed_statement_reports_sqlite_and_runs_again() {
        let conn = table();
        let mut statements = Statements::default();
        let insert = |statements: &mut Statements, b: Option<i64>| {
            statements.execute_rows(&conn, &PAIRS, 1, |p| {
                p.set(1, 1i64)?;
                p.set(2, "a")?;
                p.set(3, b)
            })
        };
        let err = insert(&mut statements, None).unwrap_err();
        assert!(
            err.to_string().contains("NOT NULL constraint failed: t.b"),
            "{err}"
        );
        assert_eq!(insert(&mut statements, Some(2)).unwrap(), 1);
        // The bindings were cleared: an unbound parameter is NULL.
        let err = statements
            .execute_rows(&conn, &PAIRS, 1, |p| p.set(1, 1i64))
            .unwrap_err();
        assert!(err.to_string().contains("NOT NULL"), "{err}");
        let bad = MultiRow::new("INSERT INTO nowhere VALUES", "(?#1)", 0, 1);
        let bad: &'static MultiRow = Box::leak(Box::new(bad));
        let err = statements
            .execute_rows(&conn, bad, 1, |_| Ok(()))
            .unwrap_err();
        assert!(err.to_string().contains("no such table: nowhere"), "{err}");
        statements.clear();
        conn.close().map_err(|(_, e)| e).unwrap();
    }

    #[test]
    fn another_connection_gets_statements_of_its_own() {
        let (one, two) = (table(), table());
        let mut statements = Statements::default();
        for conn in [&one, &two, &one] {
            let n = statements
                .execute_rows(conn, &PAIRS, 1, |p| {
                    p.set(1, 1i64)?;
                    p.set(2, "a")?;
                    p.set(3, 2i64)
                })
                .unwrap();
            assert_eq!(n, 1);
        }
        let count = |c: &Connection| -> i64 {
            c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!((count(&one), count(&two)), (2, 1));
        drop(statements);
        one.close().map_err(|(_, e)| e).unwrap();
        two.close().map_err(|(_, e)| e).unwrap();
    }
}
