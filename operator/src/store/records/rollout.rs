//! An agent's rollout as the store keeps it (docs/behaviour.md#rolling-out-a-change): the
//! target and previous templates, which template each node was handed and since when, the
//! pause, the failure and the counts the view shows. Kept in memory only while it holds
//! something the agent's own CP item does not say (a rollout under way, a restart stamp, an
//! undone target); stored as JSON in the `kv` table under [`Rollout::key`] for as long as
//! the agent is listed, so `undo` finds the previous template after a restart.

use crate::clock;
use crate::model::{Id, SpecId, Template};
use fleet_api::rollout::{FailedReplica, RolloutPolicy, RolloutState, TemplateView, WaitingReplica};
use fleet_api::RolloutView;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One replica's share of the agent under a rollout, on the node it runs on: 40 bytes, for every
/// replica of every agent under a rollout. Replicas of one agent on one node step one at a
/// time, each on its own template (docs/behaviour.md#rolling-out-a-change); the list is sorted
/// by node, then replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStep {
    pub node: Id,
    /// The template the replica was handed.
    pub on: SpecId,
    /// The replica's index; [`EVERY_REPLICA`] in a record stored before steps were per
    /// replica, where one step stood for the agent's every replica on the node.
    #[serde(default = "every_replica")]
    pub replica: u16,
    #[serde(default)]
    pub restarts: u16,
    /// When it was handed it (ms).
    pub stepped_ms: i64,
    /// On the target: since when the replica has been seen running it without a restart (ms;
    /// 0: not yet), and the restarts counted then. On an older template: since when a step
    /// of it has waited for the replica to go idle (ms; 0: not waiting).
    #[serde(default)]
    pub ready_since_ms: i64,
}

/// The replica of a step stored before steps were per replica: every replica on its node.
pub const EVERY_REPLICA: u16 = u16::MAX;

fn every_replica() -> u16 {
    EVERY_REPLICA
}

impl NodeStep {
    /// A replica's step on `on`, handed at `stepped_ms`.
    pub fn new(node: Id, replica: u32, on: SpecId, stepped_ms: i64) -> NodeStep {
        NodeStep { node, on, replica: step_replica(replica), restarts: 0, stepped_ms, ready_since_ms: 0 }
    }

    fn key(&self) -> (&str, u16) {
        (&self.node, self.replica)
    }
}

/// A replica index as a step keeps it (indexes stay below 1,000: `placement.replicas`' bound).
pub fn step_replica(r: u32) -> u16 {
    u16::try_from(r).unwrap_or(EVERY_REPLICA - 1)
}

/// A count kept in a [`NodeStep`]: saturated at `u16::MAX`.
pub fn step_count(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub desired: u32,
    pub updated: u32,
    pub ready: u32,
    pub unavailable: u32,
    pub budget: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    pub agent: Id,
    pub state: RolloutState,
    pub target: Arc<Template>,
    /// The last template that completed: `undo` brings it back, and replicas placed anew
    /// while the rollout is halted get it.
    pub previous: Option<Arc<Template>>,
    /// By node id. Shared by the record and the copy a pass evaluates, and copied only when
    /// a step or a node's readiness moves (`Arc::make_mut`): a pass looks at every rollout
    /// under way, and a copy of each list for each look churned the allocator with copies
    /// thrown away (docs/performance.md#bodies-let-go-once-served-the-ninth-run).
    #[serde(default)]
    pub nodes: Arc<[NodeStep]>,
    /// Paused by an admin: no step is taken (the state shows `paused` while it would progress).
    #[serde(default)]
    pub paused: bool,
    pub policy: RolloutPolicy,
    /// The superseded templates, the policy's error, the failure and the message: most
    /// rollouts hold none of them.
    #[serde(flatten)]
    pub rare: RareBox,
    #[serde(default)]
    pub counts: Counts,
    pub started_ms: i64,
    pub changed_ms: i64,
}

/// What few rollouts hold, boxed apart so that a rollout under way, one per agent a
/// fleet-wide change touches, costs 192 bytes and its node list 40 bytes a node
/// (docs/performance.md#smaller-rollout-records-the-tenth-run).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rare {
    /// Other templates nodes were handed and still run (a superseded target).
    #[serde(default)]
    pub older: Vec<Arc<Template>>,
    #[serde(default)]
    pub policy_error: Option<String>,
    #[serde(default)]
    pub failed: Vec<FailedReplica>,
    #[serde(default)]
    pub message: Option<String>,
    /// The replicas the next steps wait for, as the last look saw them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<Waiting>,
    /// Set while every replica left to step is outside its maintenance windows: when the
    /// next one opens (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_opens_ms: Option<i64>,
}

/// A replica a step waits for: its work (`busy`, until its lease or the hold ends) or a
/// maintenance window (`window`, until one opens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Waiting {
    pub node: Id,
    pub replica: u32,
    pub reason: WaitReason,
    pub until_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitReason {
    Busy,
    Window,
}

impl WaitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Busy => "busy",
            WaitReason::Window => "window",
        }
    }
}

static NONE_RARE: Rare = Rare {
    older: Vec::new(),
    policy_error: None,
    failed: Vec::new(),
    message: None,
    waiting: Vec::new(),
    window_opens_ms: None,
};

/// [`Rare`], boxed only while it holds something. Read through `Deref`; written through
/// `DerefMut`, which boxes it, and [`RareBox::tidy`] lets an empty box go again. Stored as
/// the fields of its rollout, as before it was boxed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RareBox(Option<Box<Rare>>);

impl RareBox {
    /// Lets the box go when nothing is in it.
    pub fn tidy(&mut self) {
        if self.0.as_deref().is_some_and(|r| *r == NONE_RARE) {
            self.0 = None;
        }
    }

    pub fn is_boxed(&self) -> bool {
        self.0.is_some()
    }
}

impl std::ops::Deref for RareBox {
    type Target = Rare;
    fn deref(&self) -> &Rare {
        self.0.as_deref().unwrap_or(&NONE_RARE)
    }
}

impl std::ops::DerefMut for RareBox {
    fn deref_mut(&mut self) -> &mut Rare {
        self.0.get_or_insert_with(Box::default)
    }
}

impl Serialize for RareBox {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for RareBox {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut rare = RareBox(Some(Box::new(Rare::deserialize(d)?)));
        rare.tidy();
        Ok(rare)
    }
}

impl Rollout {
    /// A complete rollout of `target` with nothing under way (what a pause of an agent at rest
    /// holds, and what a new rollout is built from).
    pub fn at_rest(
        agent: Id,
        target: Arc<Template>,
        policy: RolloutPolicy,
        policy_error: Option<String>,
        now: i64,
    ) -> Rollout {
        let mut r = Rollout {
            agent,
            state: RolloutState::Complete,
            target,
            previous: None,
            nodes: Arc::default(),
            paused: false,
            policy,
            rare: RareBox::default(),
            counts: Counts::default(),
            started_ms: 0,
            changed_ms: now,
        };
        r.rare.policy_error = policy_error;
        r.rare.tidy();
        r
    }

    /// Its row's key in `kv`.
    pub fn key(agent: &str) -> String {
        format!("rollout/{agent}")
    }

    /// Where a replica's step is in the list, or where it would go.
    pub fn find(&self, node: &str, replica: u32) -> Result<usize, usize> {
        self.nodes.binary_search_by(|s| s.key().cmp(&(node, step_replica(replica))))
    }

    /// The replica's step: its own, or a step stored for every replica on its node.
    pub fn step(&self, node: &str, replica: u32) -> Option<&NodeStep> {
        let at = self.find(node, replica).or_else(|_| self.find(node, u32::from(EVERY_REPLICA))).ok()?;
        Some(&self.nodes[at])
    }

    /// The template of this id among those the rollout knows.
    pub fn template(&self, id: SpecId) -> Option<&Arc<Template>> {
        std::iter::once(&self.target).chain(self.previous.iter()).chain(self.rare.older.iter()).find(|t| t.id() == id)
    }

    /// What a replica is sent on its node: the template it was handed, else (new there) the
    /// target — or, while the rollout is halted or reverted, the last one that completed.
    pub fn template_of(&self, node: &str, replica: u32) -> &Arc<Template> {
        if let Some(t) = self.step(node, replica).and_then(|s| self.template(s.on)) {
            return t;
        }
        self.for_new()
    }

    /// What a replica new to the agent's rollout gets.
    pub fn for_new(&self) -> &Arc<Template> {
        match (self.state, &self.previous) {
            (RolloutState::Halted | RolloutState::Reverted, Some(p)) => p,
            _ => &self.target,
        }
    }

    /// Equal but for what changes with every report (the counts, each node's readiness).
    pub fn same_stored(&self, other: &Rollout) -> bool {
        fn steps(r: &Rollout) -> impl Iterator<Item = (&Id, u16, SpecId, i64)> {
            r.nodes.iter().map(|s| (&s.node, s.replica, s.on, s.stepped_ms))
        }
        self.state == other.state
            && self.target == other.target
            && self.previous == other.previous
            && self.paused == other.paused
            && self.policy == other.policy
            && self.rare == other.rare
            && self.started_ms == other.started_ms
            && steps(self).eq(steps(other))
    }

    /// Whether it still holds anything the agent's own item (`own`) does not say.
    pub fn worth_keeping(&self, own: &Template) -> bool {
        self.state != RolloutState::Complete || self.paused || !self.target.same(own)
    }

    /// Replicas handed the target: from the node list while a rollout is under way (so a
    /// record read back from the database says it as stored), every one once complete.
    pub fn updated(&self) -> u32 {
        match self.state {
            RolloutState::Complete => self.counts.updated,
            _ => {
                let target = self.target.id();
                self.nodes.iter().filter(|s| s.on == target).count() as u32
            }
        }
    }

    /// The state as shown: a progressing rollout an admin paused is `paused`, one whose every
    /// replica left to step is outside its windows `waiting_for_window`.
    pub fn view_state(&self) -> RolloutState {
        match self.state {
            RolloutState::Progressing if self.paused => RolloutState::Paused,
            RolloutState::Progressing if self.rare.window_opens_ms.is_some() => RolloutState::WaitingForWindow,
            s => s,
        }
    }

    /// The view of `GET /api/v1/agents/{key}/rollout`; `nodes` names node ids.
    pub fn view(&self, node_name: impl Fn(&str) -> String) -> RolloutView {
        let t = |t: &Template| TemplateView {
            spec_id: t.id().to_string(),
            revision: t.revision,
            image: t.executor.image.clone(),
        };
        let shown_state = self.view_state();
        let failed = self
            .rare
            .failed
            .iter()
            .map(|f| FailedReplica { replica: f.replica, node: node_name(&f.node), reason: f.reason.clone() })
            .collect();
        RolloutView {
            agent_key: self.agent.to_string(),
            state: shown_state,
            policy: self.policy.clone(),
            policy_error: self.rare.policy_error.clone(),
            target: t(&self.target),
            previous: self.previous.as_deref().map(t),
            desired_replicas: self.counts.desired,
            updated_replicas: self.updated(),
            ready_replicas: self.counts.ready,
            unavailable_replicas: self.counts.unavailable,
            budget: self.counts.budget,
            failed,
            waiting: self
                .rare
                .waiting
                .iter()
                .map(|w| WaitingReplica {
                    replica: w.replica,
                    node: node_name(&w.node),
                    reason: w.reason.as_str().into(),
                    until: clock::rfc3339_ms(w.until_ms),
                })
                .collect(),
            next_window: self.rare.window_opens_ms.map(clock::rfc3339_ms),
            started_at: (self.started_ms > 0).then(|| clock::rfc3339_ms(self.started_ms)),
            changed_at: (self.changed_ms > 0).then(|| clock::rfc3339_ms(self.changed_ms)),
            message: self.rare.message.clone(),
            cp_read_at: None,
            as_of: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_api::rollout::{MaxUnavailable, OnFailure};
    use fleet_api::Executor;

    fn template(image: &str) -> Arc<Template> {
        let executor = Executor { kind: "k".into(), image: Some(image.into()) };
        Arc::new(Template::new(executor, vec![], Default::default(), 0, 1))
    }

    fn rollout() -> Rollout {
        let (old, new) = (template("a:1"), template("a:2"));
        Rollout {
            agent: "coder".into(),
            state: RolloutState::Progressing,
            target: new.clone(),
            previous: Some(old.clone()),
            nodes: Arc::from(vec![
                NodeStep::new("n1".into(), 0, new.id(), 5),
                NodeStep::new("n2".into(), 0, old.id(), 0),
                NodeStep::new("n2".into(), 1, new.id(), 7),
            ]),
            paused: false,
            policy: RolloutPolicy {
                max_unavailable: MaxUnavailable::Count(1),
                min_ready_seconds: 5,
                progress_deadline_seconds: 600,
                canary: 0,
                on_failure: OnFailure::Halt,
                max_busy_seconds: 3600,
            },
            rare: RareBox::default(),
            counts: Counts::default(),
            started_ms: 1,
            changed_ms: 2,
        }
    }

    #[test]
    fn a_replica_is_sent_what_it_was_handed_and_a_new_one_the_target_unless_halted() {
        let mut r = rollout();
        let image = |r: &Rollout, n: &str, i: u32| r.template_of(n, i).executor.image.clone().unwrap();
        assert_eq!(image(&r, "n1", 0), "a:2");
        assert_eq!((image(&r, "n2", 0), image(&r, "n2", 1)), ("a:1".into(), "a:2".into()), "one node, two templates");
        assert_eq!(image(&r, "n3", 0), "a:2");
        assert_eq!(r.updated(), 2);
        r.state = RolloutState::Halted;
        assert_eq!(image(&r, "n3", 0), "a:1");
        let back: Rollout = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    /// A record stored when a step stood for every replica on its node reads as such.
    #[test]
    fn a_step_stored_for_a_whole_node_holds_for_each_of_its_replicas() {
        let r = rollout();
        let mut stored = serde_json::to_value(&r).unwrap();
        let steps = stored["nodes"].as_array_mut().unwrap();
        steps.truncate(2);
        for s in steps.iter_mut() {
            let o = s.as_object_mut().unwrap();
            o.remove("replica");
            o.insert("replicas".into(), serde_json::json!(2));
        }
        let back: Rollout = serde_json::from_value(stored).unwrap();
        let image = |n: &str, i: u32| back.template_of(n, i).executor.image.clone().unwrap();
        assert_eq!((image("n2", 0), image("n2", 1), image("n1", 1)), ("a:1".into(), "a:1".into(), "a:2".into()));
    }

    #[test]
    fn a_rollout_under_way_fits_in_192_bytes_and_a_node_step_in_40() {
        // With its Arc's two counters, in jemalloc's 192-byte class; its node list a slice.
        assert!(std::mem::size_of::<Rollout>() + 16 <= 192, "Rollout is {} bytes", std::mem::size_of::<Rollout>());
        assert_eq!(std::mem::size_of::<NodeStep>(), 40);
    }

    #[test]
    fn the_rare_fields_are_boxed_only_when_set_and_stored_as_before() {
        let mut r = rollout();
        let stored = serde_json::to_value(&r).unwrap();
        for (field, empty) in [("older", "[]"), ("policyError", "null"), ("failed", "[]"), ("message", "null")] {
            assert_eq!(stored[field].to_string(), empty, "{field} is stored as it was before the box");
        }
        let back: Rollout = serde_json::from_value(stored).unwrap();
        assert!(!back.rare.is_boxed(), "nothing rare read back: no box");
        r.rare.message = Some("halted".into());
        r.rare.failed = vec![FailedReplica { replica: 2, node: "n1".into(), reason: "crashloop".into() }];
        assert!(r.rare.is_boxed());
        let back: Rollout = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.rare.failed[0].reason, "crashloop");
        r.rare.message = None;
        r.rare.failed.clear();
        r.rare.tidy();
        assert!(!r.rare.is_boxed(), "an emptied box is let go");
        let mut old: serde_json::Value = serde_json::to_value(&r).unwrap();
        old.as_object_mut().unwrap().remove("older");
        let back: Rollout = serde_json::from_value(old).unwrap();
        assert_eq!(back, r, "a row without the field reads as empty");
    }

    #[test]
    fn a_paused_rollout_shows_paused_and_a_complete_one_with_the_items_template_is_let_go() {
        let mut r = rollout();
        r.paused = true;
        assert_eq!(r.view(|n| n.to_string()).state, RolloutState::Paused);
        r.state = RolloutState::Complete;
        assert!(r.worth_keeping(&r.target.clone()), "a pause is kept for the next rollout");
        r.paused = false;
        assert!(!r.worth_keeping(&r.target.clone()));
        r.target = Arc::new(r.target.restarted());
        assert!(r.worth_keeping(&template("a:2")));
    }
}
