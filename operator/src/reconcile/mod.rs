//! Deciding what should be, by role:
//!
//! - `rules` — the pure rules: placement, PAT ceilings, agent status, desired states, the
//!   explanation of a placement, and what the pass and the audit derive from the registry.
//!   No I/O, no clock of their own: table-driven and property tests hold them to the docs.
//! - `pass` — the reconcile pass that drives the rules over the registry (snapshot, place,
//!   decide, publish), its memo between runs, liveness, gauges, the CP agent-list reader and
//!   the audit against a from-scratch recompute.
//! - `work` — the side calls as keyed work items (identity, PAT issue and revoke, CP status)
//!   and their queue, the PAT rotation schedule, and node GC.

pub mod pass;
pub mod rules;
pub mod work;
