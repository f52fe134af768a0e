// The backup's SQL over rows of the catalogue, written once and compiled once per backend
// (`backend.rs` includes this file into `sqlite` and `pg`, each with its own `DB` and `Conn`).
// Booleans are read and bound as `bool`: SQLite's driver takes its 0/1 integers for them.

use crate::backup::rows::Value;
use crate::backup::tables::{Kind, Table};
use crate::store::db::DbError;
use futures::TryStreamExt;
use sqlx::query_builder::Separated;
use sqlx::{QueryBuilder, Row};

/// Bound values per statement, as the store's own writes keep them.
const MAX_VARS: usize = 3_000;

/// Every row of `t`, handed to `each` as it is read (a table is never held whole).
pub async fn read(c: &mut Conn, t: &Table, mut each: impl FnMut(Vec<Value>)) -> Result<(), DbError> {
    let sql = format!("SELECT {} FROM {}", t.column_list(), t.name);
    let mut rows = sqlx::query(&sql).fetch(&mut *c);
    while let Some(row) = rows.try_next().await? {
        let mut values = Vec::with_capacity(t.columns.len());
        for (i, kind) in t.kinds().enumerate() {
            values.push(value(&row, i, kind)?);
        }
        each(values);
    }
    Ok(())
}

fn value(row: &<DB as sqlx::Database>::Row, i: usize, kind: Kind) -> Result<Value, sqlx::Error> {
    Ok(match kind {
        Kind::Int => row.try_get::<Option<i64>, _>(i)?.map_or(Value::Null, Value::Int),
        Kind::Bool => row.try_get::<Option<bool>, _>(i)?.map_or(Value::Null, |b| Value::Int(i64::from(b))),
        Kind::Text => row.try_get::<Option<String>, _>(i)?.map_or(Value::Null, Value::Text),
        Kind::Blob => row.try_get::<Option<Vec<u8>>, _>(i)?.map_or(Value::Null, Value::Blob),
    })
}

/// Inserts `rows` into `t`, as many to a statement as the bound values allow.
pub async fn insert(c: &mut Conn, t: &Table, rows: &[Vec<Value>]) -> Result<(), DbError> {
    let head = format!("INSERT INTO {} ({}) ", t.name, t.column_list());
    for chunk in rows.chunks((MAX_VARS / t.columns.len()).max(1)) {
        let mut qb = QueryBuilder::<DB>::new(&head);
        qb.push_values(chunk, |mut b, row| {
            for (v, kind) in row.iter().zip(t.kinds()) {
                bind(&mut b, v, kind);
            }
        });
        qb.build().persistent(false).execute(&mut *c).await?;
    }
    Ok(())
}

fn bind(b: &mut Separated<'_, '_, DB, &'static str>, v: &Value, kind: Kind) {
    match (v, kind) {
        (Value::Null, Kind::Int) => b.push_bind(None::<i64>),
        (Value::Null, Kind::Bool) => b.push_bind(None::<bool>),
        (Value::Null, Kind::Text) => b.push_bind(None::<String>),
        (Value::Null, Kind::Blob) => b.push_bind(None::<Vec<u8>>),
        (Value::Int(i), Kind::Bool) => b.push_bind(*i != 0),
        (Value::Int(i), _) => b.push_bind(*i),
        (Value::Text(s), _) => b.push_bind(s.clone()),
        (Value::Blob(x), _) => b.push_bind(x.clone()),
    };
}

/// Rows in `t`.
pub async fn count(c: &mut Conn, t: &str) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {t}")).fetch_one(&mut *c).await?)
}

/// Empties `t`.
pub async fn clear(c: &mut Conn, t: &str) -> Result<(), DbError> {
    sqlx::query(&format!("DELETE FROM {t}")).execute(&mut *c).await?;
    Ok(())
}

/// Sets a `kv` row.
pub async fn put_kv(c: &mut Conn, key: &str, value: &str) -> Result<(), DbError> {
    sqlx::query("DELETE FROM kv WHERE key = $1").bind(key).execute(&mut *c).await?;
    sqlx::query("INSERT INTO kv (key, value) VALUES ($1, $2)").bind(key).bind(value).execute(&mut *c).await?;
    Ok(())
}
