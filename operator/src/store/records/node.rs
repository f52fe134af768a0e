//! A node as the registry keeps it: what it announced and last reported ([`NodeInfo`], stored
//! as JSON), its identity (id, name, token hash, public key) and its lifecycle (schedulable,
//! cordoned, draining), with the small types an admin's lifecycle action and a drain's
//! progress are told in.

use super::seen::Seen;
use crate::clock;
use crate::model::Id;
use fleet_api::claims::{Allowance, Claimed};
use fleet_api::images::AllowList;
use fleet_api::{Capacity, Health, NodeStatus, NodeView};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// What a node announced and last reported; stored as JSON. Labels, kinds, images and
/// per-kind secrets are the *effective* facts, those its allowance admits: everything that
/// reads them (placement, the explanation, views, the mirror) sees only what the node may
/// claim. What it claimed beyond them is kept aside in `refused`
/// (docs/behaviour.md#what-a-node-may-claim).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    pub labels: Vec<String>,
    pub executor_kinds: Vec<String>,
    pub executor_images: BTreeMap<String, Vec<String>>,
    pub capacity: Capacity,
    pub secrets: Vec<String>,
    /// The secrets offered to each kind that lists its own (a subset of `secrets`); boxed,
    /// since most nodes have none and 10,000 records are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor_secrets: Option<Box<BTreeMap<String, Vec<String>>>>,
    /// What the node claimed and its allowance refused: labels, kinds and those kinds' lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Box<Claimed>>,
    pub version: String,
    pub health: Option<Health>,
    pub observe_seconds: Option<u32>,
    pub replicas: Vec<Seen>,
    /// node.yaml's `maintenanceWindows` (docs/behaviour.md#maintenance-windows), as announced;
    /// boxed, since most nodes name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_windows: Option<Box<Vec<fleet_api::windows::MaintenanceWindow>>>,
    pub applied_generation: u64,
    pub boot_id: Option<Box<str>>,
    pub seq: Option<u64>,
}

impl NodeInfo {
    /// The windows as announced, boxed only when there are any.
    pub fn windows_from(
        list: &[fleet_api::windows::MaintenanceWindow],
    ) -> Option<Box<Vec<fleet_api::windows::MaintenanceWindow>>> {
        (!list.is_empty()).then(|| Box::new(list.to_vec()))
    }

    pub fn windows(&self) -> &[fleet_api::windows::MaintenanceWindow] {
        self.maintenance_windows.as_deref().map_or(&[], |v| v.as_slice())
    }

    /// What the node last reported of one replica of `agent`.
    pub fn replica(&self, agent: &str, replica: u32) -> Option<&Seen> {
        self.replicas.iter().find(|p| *p.agent_key == *agent && p.replica == replica)
    }

    /// Until when (ms) a replica of `agent` said it is busy, if after `now_ms`; `busy` is the
    /// node's, by position in `replicas` ([`busy_of`]).
    pub fn busy_until_ms(&self, busy: Option<&[u32]>, agent: &str, replica: u32, now_ms: i64) -> Option<i64> {
        let at = self.replicas.iter().position(|p| *p.agent_key == *agent && p.replica == replica)?;
        let until = i64::from(*busy?.get(at)?) * 1000;
        (until > now_ms).then_some(until)
    }

    /// Every replica as the API shows it, with its busy lease.
    pub fn reports(&self, busy: Option<&[u32]>, now_ms: i64) -> Vec<fleet_api::ReplicaReport> {
        self.replicas
            .iter()
            .map(|p| {
                let mut r = p.to_report();
                r.busy_until = self.busy_until_ms(busy, &p.agent_key, p.replica, now_ms).map(clock::rfc3339_ms);
                r
            })
            .collect()
    }
}

/// A node's windows read, `None` when it names none. One it names wrongly (a newer node's
/// rule, a hand-made report) is left out with a warning: a node cannot hold its disruptions
/// with a window that never opens.
pub fn windows_of(
    node: &str,
    list: &[fleet_api::windows::MaintenanceWindow],
) -> Option<std::sync::Arc<[fleet_api::windows::Window]>> {
    if list.is_empty() {
        return None;
    }
    let read: Vec<_> = list
        .iter()
        .filter_map(|w| {
            fleet_api::windows::Window::parse(w)
                .map_err(|e| tracing::warn!(node, problem = %e, "a node's maintenance window is ignored"))
                .ok()
        })
        .collect();
    (!read.is_empty()).then(|| read.into())
}

/// Until when each reported replica is busy (Unix seconds, 0 idle), `None` when none is: only
/// a running replica may be busy, a time past or unreadable is idle, and none is kept busy
/// past the hard cap ([`fleet_api::rollout::MAX_BUSY_SECONDS`]) from now.
pub fn busy_of(replicas: &[fleet_api::ReplicaReport], now_ms: i64) -> Option<Box<[u32]>> {
    let cap = now_ms + i64::from(fleet_api::rollout::MAX_BUSY_SECONDS) * 1000;
    let until = |r: &fleet_api::ReplicaReport| {
        let ms = r.busy_until.as_deref().and_then(clock::parse_rfc3339_ms)?;
        (r.state == fleet_api::ReplicaState::Running && ms > now_ms).then(|| (ms.min(cap) / 1000) as u32)
    };
    let busy: Box<[u32]> = replicas.iter().map(|r| until(r).unwrap_or(0)).collect();
    busy.iter().any(|b| *b > 0).then_some(busy)
}

#[derive(Debug, Clone)]
pub struct NodeRec {
    pub id: Id,
    pub name: Id,
    pub token_hash: [u8; 32],
    pub public_key: [u8; 32],
    pub joined_ms: i64,
    pub last_seen_ms: i64,
    pub info: NodeInfo,
    pub allow: BTreeMap<String, AllowList>,
    /// What it may claim; `None` allows anything (docs/behaviour.md#what-a-node-may-claim).
    pub allowed: Option<Box<Allowance>>,
    pub lifecycle: Lifecycle,
    /// This replica has heard from the node since it loaded the store (a report, or its join):
    /// it knows the generation the node holds. A store older than the fleet builds no body for
    /// a node before (docs/behaviour.md#a-store-older-than-the-fleet).
    pub reported: bool,
}

impl NodeRec {
    /// Silence after which this node is offline: max(configured, 3 × its report period).
    pub fn threshold(&self, offline_after: Duration) -> Duration {
        offline_after.max(Duration::from_secs(3 * u64::from(self.info.observe_seconds.unwrap_or(0))))
    }

    pub fn online(&self, now_ms: i64, offline_after: Duration) -> bool {
        now_ms - self.last_seen_ms <= self.threshold(offline_after).as_millis() as i64
    }

    pub fn view(&self, now_ms: i64, offline_after: Duration) -> NodeView {
        NodeView {
            id: self.id.to_string(),
            name: self.name.to_string(),
            labels: self.info.labels.clone(),
            executor_kinds: self.info.executor_kinds.clone(),
            executor_images: self.info.executor_images.clone(),
            capacity: self.info.capacity.clone(),
            secrets: self.info.secrets.clone(),
            executor_secrets: self.info.executor_secrets.as_deref().cloned().unwrap_or_default(),
            allowed_labels: self.allowed.as_ref().and_then(|a| a.allowed_labels.clone()),
            allowed_kinds: self.allowed.as_ref().and_then(|a| a.allowed_kinds.clone()),
            refused_facts: self.info.refused_facts(),
            health: self.info.health.unwrap_or(Health::Ok),
            status: if self.online(now_ms, offline_after) { NodeStatus::Online } else { NodeStatus::Offline },
            last_seen_at: clock::rfc3339_ms(self.last_seen_ms),
            version: self.info.version.clone(),
            slots_used: 0,
            schedulable: self.lifecycle.schedulable(),
            drain: None,
            maintenance_windows: self.info.windows().to_vec(),
        }
    }

    /// Takes a new report or announcement, with the image allow-lists parsed once here.
    pub fn set_info(&mut self, info: NodeInfo) {
        self.allow = parse_allow(&info.executor_images);
        self.info = info;
    }
}

fn parse_allow(images: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, AllowList> {
    images.iter().map(|(k, v)| (k.clone(), AllowList::parse(v).unwrap_or_default())).collect()
}

/// Whether new replicas may be placed on a node, and whether its replicas are moving off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lifecycle {
    #[default]
    Schedulable,
    /// No new replica is placed; those there stay.
    Cordoned,
    /// Cordoned, and every replica moves off; `done_ms` once none is left bound.
    Draining { started_ms: i64, force: bool, done_ms: Option<i64> },
}

impl Lifecycle {
    pub fn schedulable(self) -> bool {
        self == Lifecycle::Schedulable
    }

    /// `Some(force)` while draining.
    pub fn draining(self) -> Option<bool> {
        match self {
            Lifecycle::Draining { force, .. } => Some(force),
            _ => None,
        }
    }

    /// As stored: (cordoned, drain started, force, drain done).
    pub fn columns(self) -> (bool, Option<i64>, bool, Option<i64>) {
        match self {
            Lifecycle::Schedulable => (false, None, false, None),
            Lifecycle::Cordoned => (true, None, false, None),
            Lifecycle::Draining { started_ms, force, done_ms } => (true, Some(started_ms), force, done_ms),
        }
    }

    pub fn from_columns(cordoned: bool, started: Option<i64>, force: bool, done: Option<i64>) -> Lifecycle {
        match (started, cordoned) {
            (Some(started_ms), _) => Lifecycle::Draining { started_ms, force, done_ms: done },
            (None, true) => Lifecycle::Cordoned,
            (None, false) => Lifecycle::Schedulable,
        }
    }
}

/// What an admin asks of a node's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Cordon,
    Uncordon,
    Drain { force: bool },
}

/// A drain's progress as the last pass saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainProgress {
    /// Replicas still bound to the node.
    pub remaining: u32,
    /// Those that stay: (agent, replica, why: `budget`, `busy` or `no_other_node`).
    pub blocked: Vec<(Id, u32, &'static str)>,
}

/// A deleted node, and the credentials to revoke now.
#[derive(Debug)]
pub struct Deleted {
    pub id: Id,
    pub name: Id,
    pub revoke: Vec<String>,
}

impl NodeRec {
    /// A node with this id and name and nothing else: seen at 0, no token, no report (tests).
    #[cfg(test)]
    pub fn bare(id: &str, name: &str) -> NodeRec {
        NodeRec {
            id: id.into(),
            name: name.into(),
            token_hash: [0; 32],
            public_key: [0; 32],
            joined_ms: 0,
            last_seen_ms: 0,
            info: NodeInfo::default(),
            allow: BTreeMap::new(),
            allowed: None,
            lifecycle: Lifecycle::default(),
            reported: false,
        }
    }
}

/// A list as the registry keeps it: sorted and each entry once, so order alone is never a
/// change.
pub fn sorted(v: &[String]) -> Vec<String> {
    let mut v = v.to_vec();
    v.sort();
    v.dedup();
    v
}

/// The `kv` rows that keep a deleted node's token hash (`deleted/<hex of the hash>`), so that
/// its token is refused as revoked, not as unknown (docs/behaviour.md#a-store-older-than-the-fleet).
pub const DELETED_PREFIX: &str = "deleted/";

/// The `kv` key of a deleted node's token hash.
pub fn deleted_key(token_hash: &[u8]) -> String {
    let hex: String = token_hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("{DELETED_PREFIX}{hex}")
}

/// A token hash from its hex; `None` for anything else.
pub fn from_hex(hex: &str) -> Option<[u8; 32]> {
    let bytes: Option<Vec<u8>> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect();
    bytes?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_record_stays_small() {
        // 10,000 of them live in the registry, each boxed: in jemalloc's 448-byte class (440
        // bytes took the same class; `reported` filled it).
        assert!(std::mem::size_of::<NodeRec>() <= 448, "NodeRec is {} bytes", std::mem::size_of::<NodeRec>());
    }

    #[test]
    fn a_node_is_offline_after_three_report_periods_or_the_threshold() {
        let mut n = NodeRec::bare("n", "n");
        assert!(n.online(10_000, Duration::from_secs(10)) && !n.online(10_001, Duration::from_secs(10)));
        n.info.observe_seconds = Some(5);
        assert!(n.online(15_000, Duration::from_secs(10)) && !n.online(15_001, Duration::from_secs(10)));
    }

    #[test]
    fn a_deleted_tokens_key_reads_back() {
        let hash = [0xabu8; 32];
        let key = deleted_key(&hash);
        assert_eq!(key, format!("deleted/{}", "ab".repeat(32)));
        assert_eq!(key.strip_prefix(DELETED_PREFIX).and_then(from_hex), Some(hash));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
    }
}
