//! Every row of the fleet's state from one store into another (docs/operations.md#from-sqlite-to-postgresql-and-back):
//! table by table in the catalogue's order, the target written in one transaction, then both
//! read again and compared table by table — the count of rows and a checksum of them — so a
//! copy that does not match is an error, not a surprise after the switch.

use super::backend::pg;
use super::rows::{Tally, Value};
use super::stores::{on, Conn};
use super::tables::{Table, TABLES};
use crate::store::db::DbError;

/// One table as copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCopy {
    pub name: &'static str,
    pub rows: u64,
    pub checksum: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{0}")]
    Db(#[from] DbError),
    #[error("{0}")]
    Sql(#[from] sqlx::Error),
    #[error("the target is not empty ({table} has {rows} rows): copy into an empty database")]
    NotEmpty { table: &'static str, rows: i64 },
    #[error("table {table} differs after the copy: {source_rows} rows ({source_sum}) in the source, {target_rows} ({target_sum}) in the target")]
    Differs { table: &'static str, source_rows: u64, source_sum: String, target_rows: u64, target_sum: String },
}

async fn read_all(c: &mut Conn, t: &Table) -> Result<Vec<Vec<Value>>, DbError> {
    let mut rows = Vec::new();
    on!(c, read(t, |r| rows.push(r)))?;
    Ok(rows)
}

/// Each table's count of rows and checksum.
pub async fn tally(c: &mut Conn) -> Result<Vec<TableCopy>, DbError> {
    let mut out = Vec::with_capacity(TABLES.len());
    for t in TABLES {
        let mut tally = Tally::default();
        on!(c, read(t, |r| tally.add(&r)))?;
        out.push(TableCopy { name: t.name, rows: tally.rows(), checksum: tally.checksum() });
    }
    Ok(out)
}

/// Refuses a target that holds any row of the fleet's state.
pub async fn refuse_unless_empty(c: &mut Conn) -> Result<(), CopyError> {
    for t in TABLES {
        let rows = on!(c, count(t.name))?;
        if rows > 0 {
            return Err(CopyError::NotEmpty { table: t.name, rows });
        }
    }
    Ok(())
}

/// Writes every row `src` reads into `dst` in one transaction (emptying `dst`'s tables first
/// when `replace`), then compares the two table by table.
pub async fn rows(src: &mut Conn, dst: &mut Conn, replace: bool) -> Result<Vec<TableCopy>, CopyError> {
    begin(dst).await?;
    for t in TABLES {
        if replace {
            on!(dst, clear(t.name))?;
        }
        let rows = read_all(src, t).await?;
        on!(dst, insert(t, &rows))?;
    }
    if let Conn::Pg(c) = dst {
        pg::resume_event_seq(c).await?;
    }
    commit(dst).await?;
    let (from, to) = (tally(src).await?, tally(dst).await?);
    for (s, d) in from.iter().zip(&to) {
        if s != d {
            return Err(CopyError::Differs {
                table: s.name,
                source_rows: s.rows,
                source_sum: s.checksum.clone(),
                target_rows: d.rows,
                target_sum: d.checksum.clone(),
            });
        }
    }
    Ok(from)
}

async fn begin(c: &mut Conn) -> Result<(), sqlx::Error> {
    match c {
        Conn::Sqlite(c) => sqlx::query("BEGIN IMMEDIATE").execute(c).await.map(drop),
        Conn::Pg(c) => sqlx::query("BEGIN").execute(c).await.map(drop),
    }
}

async fn commit(c: &mut Conn) -> Result<(), sqlx::Error> {
    match c {
        Conn::Sqlite(c) => sqlx::query("COMMIT").execute(c).await.map(drop),
        Conn::Pg(c) => sqlx::query("COMMIT").execute(c).await.map(drop),
    }
}

/// The copy's report: a line per table.
pub fn report(tables: &[TableCopy]) -> String {
    let mut out = format!("{:<12} {:>10}  {}\n", "TABLE", "ROWS", "CHECKSUM");
    for t in tables {
        out.push_str(&format!("{:<12} {:>10}  {}\n", t.name, t.rows, t.checksum));
    }
    out
}
