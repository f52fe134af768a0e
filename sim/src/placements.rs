//! Where the replicas are, as the simulator reads it: the controller's placement list
//! (`GET /api/v1/placements`, placed and pending replicas) and the CP's statuses in the
//! devkit (agents running with every replica ready).

use fleet_devkit::Devkit;
use std::collections::HashMap;

/// Agents whose CP status says running with every replica ready.
pub fn agents_running(dk: &Devkit, replicas: u32) -> usize {
    let st = dk.state.lock();
    st.statuses
        .values()
        .filter(|h| {
            h.last().is_some_and(|s| s["phase"] == "running" && s["readyReplicas"].as_u64() == Some(replicas as u64))
        })
        .count()
}

/// The controller's placement list, summed.
#[derive(Default)]
pub struct Placements {
    pub placed: u64,
    pub pending: u64,
    /// Replicas placed per node id.
    pub by_node: HashMap<String, u64>,
    /// Pending replicas by reason code.
    pub reasons: std::collections::BTreeMap<String, u64>,
    /// The most replicas of each agent on one node.
    pub most_on_a_node: HashMap<String, u64>,
}

impl Placements {
    /// Every one of `total` replicas placed, none pending.
    pub fn all_placed(&self, total: u64) -> bool {
        self.placed == total && self.pending == 0
    }
}

/// Reads the placement list of the controller at `url` with the admin `token`.
pub async fn placements(http: &reqwest::Client, url: &str, token: &str) -> anyhow::Result<Placements> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Item {
        #[serde(default)]
        agent_key: String,
        #[serde(default)]
        replicas: u64,
        #[serde(default)]
        status: String,
        #[serde(default)]
        node_id: Option<String>,
        #[serde(default)]
        reason: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct List {
        items: Vec<Item>,
    }
    let list: List = http.get(format!("{url}/api/v1/placements")).bearer_auth(token).send().await?.json().await?;
    let mut p = Placements::default();
    for it in list.items {
        match it.status.as_str() {
            "placed" => {
                p.placed += it.replicas;
                *p.by_node.entry(it.node_id.unwrap_or_default()).or_default() += it.replicas;
                let most = p.most_on_a_node.entry(it.agent_key).or_default();
                *most = (*most).max(it.replicas);
            }
            "pending" => {
                p.pending += it.replicas;
                *p.reasons.entry(it.reason.unwrap_or_default()).or_default() += it.replicas;
            }
            _ => {}
        }
    }
    Ok(p)
}
