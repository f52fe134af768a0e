//! An event as recorded (what happened, to which agent, node and replica, when), the bounded
//! batch a pass records them in, and the filter a reader asks by. Where events are kept and
//! written is `store::events`.

use crate::clock;
use crate::model::Id;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NodeJoined,
    NodeOnline,
    NodeOffline,
    NodeCordoned,
    NodeUncordoned,
    NodeDraining,
    NodeDrained,
    NodeDeleted,
    NodeFactsRefused,
    ReplicaPlaced,
    ReplicaMoved,
    ReplicaUnbound,
    ReplicaWaiting,
    ReplicaPreempted,
    IdentityFailed,
    PatIssued,
    PatRotated,
    PatRevoked,
    AgentPhase,
    RolloutStarted,
    RolloutStep,
    RolloutPaused,
    RolloutResumed,
    RolloutHalted,
    RolloutReverted,
    RolloutCompleted,
    DisruptionWaiting,
    BusyHoldExpired,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::NodeJoined => "node_joined",
            Kind::NodeOnline => "node_online",
            Kind::NodeOffline => "node_offline",
            Kind::NodeCordoned => "node_cordoned",
            Kind::NodeUncordoned => "node_uncordoned",
            Kind::NodeDraining => "node_draining",
            Kind::NodeDrained => "node_drained",
            Kind::NodeDeleted => "node_deleted",
            Kind::NodeFactsRefused => "node_facts_refused",
            Kind::ReplicaPlaced => "replica_placed",
            Kind::ReplicaMoved => "replica_moved",
            Kind::ReplicaUnbound => "replica_unbound",
            Kind::ReplicaWaiting => "replica_waiting",
            Kind::ReplicaPreempted => "replica_preempted",
            Kind::IdentityFailed => "identity_failed",
            Kind::PatIssued => "pat_issued",
            Kind::PatRotated => "pat_rotated",
            Kind::PatRevoked => "pat_revoked",
            Kind::AgentPhase => "agent_phase",
            Kind::RolloutStarted => "rollout_started",
            Kind::RolloutStep => "rollout_step",
            Kind::RolloutPaused => "rollout_paused",
            Kind::RolloutResumed => "rollout_resumed",
            Kind::RolloutHalted => "rollout_halted",
            Kind::RolloutReverted => "rollout_reverted",
            Kind::RolloutCompleted => "rollout_completed",
            Kind::DisruptionWaiting => "disruption_waiting",
            Kind::BusyHoldExpired => "busy_hold_expired",
        }
    }
}

/// One event as recorded.
#[derive(Debug, Clone)]
pub struct Event {
    pub at_ms: i64,
    pub kind: Kind,
    pub agent: Option<Id>,
    pub node_id: Option<Id>,
    pub node: Option<Id>,
    pub replica: Option<u32>,
    pub message: String,
}

impl Event {
    pub fn new(kind: Kind, message: impl Into<String>) -> Event {
        Event {
            at_ms: clock::now_ms(),
            kind,
            agent: None,
            node_id: None,
            node: None,
            replica: None,
            message: message.into(),
        }
    }

    pub fn agent(mut self, key: &Id) -> Event {
        self.agent = Some(key.clone());
        self
    }

    /// The node, by id and name.
    pub fn node(mut self, id: &Id, name: &Id) -> Event {
        self.node_id = Some(id.clone());
        self.node = Some(name.clone());
        self
    }

    pub fn replica(mut self, r: u32) -> Event {
        self.replica = Some(r);
        self
    }
}

/// Events one pass records at most one by one; past it, one summary per kind says how many
/// more there were (a fleet coming up places 100,000 replicas in one pass).
pub const PER_PASS: usize = 1_000;

/// The events of one pass, bounded by [`PER_PASS`].
#[derive(Debug, Default)]
pub struct Batch {
    events: Vec<Event>,
    /// Events already taken out by [`Batch::take_recorded`]: they count toward the bound.
    taken: usize,
    skipped: Vec<(Kind, u32)>,
}

impl Batch {
    pub fn push(&mut self, e: Event) {
        if self.taken + self.events.len() < PER_PASS {
            self.events.push(e);
            return;
        }
        match self.skipped.iter_mut().find(|(k, _)| *k == e.kind) {
            Some((_, n)) => *n += 1,
            None => self.skipped.push((e.kind, 1)),
        }
    }

    /// The events recorded one by one so far, for a commit in the middle of the pass; the
    /// bound still counts them.
    pub fn take_recorded(&mut self) -> Vec<Event> {
        self.taken += self.events.len();
        std::mem::take(&mut self.events)
    }

    /// The events, with a summary of those not recorded one by one.
    pub fn finish(mut self) -> Vec<Event> {
        for (kind, n) in std::mem::take(&mut self.skipped) {
            let msg = format!("{n} more {} events in this pass (a pass records {PER_PASS} one by one)", kind.as_str());
            self.events.push(Event::new(kind, msg));
        }
        self.events
    }
}

/// Which events a reader wants.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub agent: Option<String>,
    /// A node id or name.
    pub node: Option<String>,
    /// Only events after this `seq`.
    pub since: i64,
    /// Only events before this `seq`.
    pub before: Option<i64>,
    pub limit: u32,
    /// Newest first (the `limit` newest of the range) instead of oldest first.
    pub newest_first: bool,
}
