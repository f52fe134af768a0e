//! What can go wrong with the database, as one error type for every layer above it.

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database: {0}")]
    Other(String),
    /// A leader write refused by the fencing check: the lease of `epoch` is no longer held.
    #[error("refused by the lease: this replica no longer leads (its epoch {epoch} has ended)")]
    Fenced { epoch: i64 },
    /// A leader write on a replica that does not lead.
    #[error("this replica is not the leader; only the leader writes placements, PATs and statuses")]
    NotLeader,
}
