//! The items of `GET /api/v1/placements` (docs/reference.md#http-api): built on demand from the agents and the
//! placement outcome ([`crate::store::kept::Placements`]); the pass only follows how they
//! change, for the placements gauge.

pub use crate::store::kept::{agent_views, listed_views, AgentItems, Item, Listed, Placements};
