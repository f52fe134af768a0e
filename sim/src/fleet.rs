//! The simulated fleet before it starts: a join key for every node (admin work, issued before
//! the convergence clock starts), how the nodes connect to the controller, the counters they
//! share and the nodes themselves.

use crate::args::{Args, Protocol, ReportConnections, SPARE_FILES};
use crate::controller::Replicas;
use crate::measure;
use crate::node::{Shared, SimNode};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Join keys requested at a time.
const JOIN_KEYS_IN_FLIGHT: usize = 64;

/// Issues `count` join keys at the controller at `url` with the admin token.
pub async fn join_keys(http: &reqwest::Client, url: &str, admin: &str, count: usize) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::with_capacity(count);
    for chunk in (0..count).collect::<Vec<_>>().chunks(JOIN_KEYS_IN_FLIGHT) {
        let futs = chunk.iter().map(|_| async move {
            let v: Value = http
                .post(format!("{url}/api/v1/join-keys"))
                .bearer_auth(admin)
                .json(&json!({"ttlSeconds": 7200}))
                .send()
                .await?
                .json()
                .await?;
            anyhow::Ok(v["joinKey"].as_str().unwrap_or_default().to_string())
        });
        for k in futures::future::join_all(futs).await {
            keys.push(k?);
        }
    }
    Ok(keys)
}

/// How the simulated nodes connect, from the flags and this process's open-file limit.
#[derive(Debug, Clone, Copy)]
pub struct Connections {
    /// The exchange: one connection per node carries its join, reports and long-polls.
    pub exchange: bool,
    /// The two routes with reports over a connection of each node's own.
    pub own_report_connections: bool,
}

impl Connections {
    /// Decides, and says so when `auto` has to share the report connections.
    pub fn choose(args: &Args) -> Connections {
        let limit = measure::open_file_limit();
        let exchange = args.protocol == Protocol::Exchange;
        let own_report_connections = !exchange && args.report_connections.own(args.nodes, limit);
        if !exchange && !own_report_connections && args.report_connections == ReportConnections::Auto {
            eprintln!(
                "fleet-sim: the open-file limit ({}) is below two sockets per node plus {SPARE_FILES}: \
                 reports share the long-polls' client pool, so the controller holds fewer connections \
                 than {} real nodes would and its peak RSS is understated",
                limit.unwrap_or(0),
                args.nodes
            );
        }
        Connections { exchange, own_report_connections }
    }

    /// The protocol, as the results name it.
    pub fn protocol(self) -> &'static str {
        if self.exchange {
            "exchange"
        } else {
            "two-routes"
        }
    }

    /// What carries the reports, as the results name it.
    pub fn reports(self) -> &'static str {
        match (self.exchange, self.own_report_connections) {
            (true, _) => "one per node (the exchange)",
            (false, true) => "own",
            (false, false) => "shared",
        }
    }
}

/// The state every node task shares: the client, the replicas' addresses, the counters.
pub fn shared(args: &Args, http: &reqwest::Client, replicas: &Replicas, conns: Connections) -> Arc<Shared> {
    Arc::new(Shared {
        http: http.clone(),
        exchange: conns.exchange,
        own_report_connections: conns.own_report_connections,
        urls: replicas.urls(),
        report_period: Duration::from_secs(args.report_seconds),
        reports_ok: AtomicU64::new(0),
        reports_failed: AtomicU64::new(0),
        joined: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        received: Mutex::new(HashMap::new()),
        busy: crate::node::Busy { percent: args.rollout_busy_percent, ..Default::default() },
    })
}

/// The `--nodes` simulated nodes, not started yet.
pub fn nodes(args: &Args) -> Vec<Arc<SimNode>> {
    (0..args.nodes).map(|i| Arc::new(SimNode::new(i, args.slots, args.zones as usize))).collect()
}
