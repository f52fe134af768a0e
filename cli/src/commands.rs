//! One function per command: call the API, print a table (or JSON).

use crate::client::{CallError, Client};
use crate::table::{age, or_dash, Table};
use crate::Output;
use fleet_api::{
    EventView, JoinKeyResponse, JoinKeyView, List, NodeDetail, NodeView, PlacementExplanation, PlacementView,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub type Result<T> = std::result::Result<T, CallError>;

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

pub fn print_json<T: Serialize>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Every page of a list route.
async fn all<T: DeserializeOwned>(c: &Client, path: &str) -> Result<Vec<T>> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let page_path = match &cursor {
            Some(c) => format!("{path}{sep}limit=1000&cursor={c}"),
            None => format!("{path}{sep}limit=1000"),
        };
        let page: List<T> = c.get(&page_path).await?;
        items.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(items),
        }
    }
}

/// Percent-encodes a path segment or query value (node names and agent keys are plain, but
/// what an admin types may not be).
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub async fn nodes(c: &Client, out: Output) -> Result<()> {
    let nodes: Vec<NodeView> = all(c, "/api/v1/nodes").await?;
    if out == Output::Json {
        print_json(&json!({ "items": nodes }));
        return Ok(());
    }
    let wide = out == Output::Wide;
    let mut header = vec!["NAME", "STATUS", "HEALTH", "SCHEDULING", "SLOTS", "VERSION", "LAST SEEN"];
    if wide {
        header.extend(["ID", "KINDS", "LABELS"]);
    }
    let mut t = Table::new(&header);
    let now = now();
    for n in &nodes {
        let mut row = vec![
            n.name.clone(),
            json!(n.status).as_str().unwrap_or_default().to_string(),
            json!(n.health).as_str().unwrap_or_default().to_string(),
            n.scheduling(),
            format!("{}/{}", n.slots_used, n.capacity.slots),
            or_dash(Some(&n.version)),
            age(&n.last_seen_at, now),
        ];
        if wide {
            row.extend([n.id.clone(), or_dash(Some(n.executor_kinds.join(","))), or_dash(Some(n.labels.join(",")))]);
        }
        t.row(row);
    }
    print!("{}", t.render());
    if nodes.is_empty() {
        eprintln!("no nodes yet: issue a key with `fleetctl join-key` and start fleet-node with it");
    }
    Ok(())
}

pub async fn node(c: &Client, out: Output, node: &str) -> Result<()> {
    let d: NodeDetail = c.get(&format!("/api/v1/nodes/{}", enc(node))).await?;
    if out == Output::Json {
        print_json(&d);
        return Ok(());
    }
    let n = &d.node;
    let status = json!(n.status);
    let lines = [
        ("Name", n.name.clone()),
        ("ID", n.id.clone()),
        ("Status", status.as_str().unwrap_or_default().to_string()),
        ("Scheduling", n.scheduling()),
        ("Slots", format!("{}/{} used", n.slots_used, n.capacity.slots)),
        ("Kinds", or_dash(Some(n.executor_kinds.join(", ")))),
        ("Labels", or_dash(Some(n.labels.join(", ")))),
        ("Secrets", or_dash(Some(n.secrets.join(", ")))),
        ("Version", or_dash(Some(&n.version))),
        ("Last seen", format!("{} ago ({})", age(&n.last_seen_at, now()), n.last_seen_at)),
        ("Generation", format!("{} (applied {})", d.generation, d.applied_generation)),
    ];
    for (k, v) in lines {
        println!("{:<12}{v}", format!("{k}:"));
    }
    if !n.refused_facts.is_empty() {
        println!("Refused:    {} (outside the node's allowance; placement ignores them)", n.refused_facts.describe());
    }
    for w in &n.maintenance_windows {
        println!(
            "Window:     {} for {} min, {} (rollout steps and PAT rotations start only then)",
            w.schedule, w.duration_minutes, w.time_zone
        );
    }
    if let Some(drain) = &n.drain {
        for b in &drain.blocked {
            let why = match b.reason.as_str() {
                "budget" => "waits for its agent's disruption budget (another replica is not ready yet)",
                "busy" => "is busy: it moves when it says it is idle, or when its agent's maxBusySeconds end",
                _ => "has nowhere else to go",
            };
            println!("Blocked:    {} replica {} {why}", b.agent_key, b.replica);
        }
    }
    let mut t = Table::new(&["AGENT", "REPLICA", "STATE", "RESTARTS", "MESSAGE"]);
    for r in &d.replicas {
        let state = json!(r.state);
        t.row(vec![
            r.agent_key.clone(),
            r.replica.to_string(),
            state.as_str().unwrap_or_default().to_string(),
            r.restarts.to_string(),
            or_dash(r.message.as_ref()),
        ]);
    }
    println!();
    print!("{}", t.render());
    Ok(())
}

pub async fn placements(c: &Client, out: Output) -> Result<()> {
    let items: Vec<PlacementView> = all(c, "/api/v1/placements").await?;
    if out == Output::Json {
        print_json(&json!({ "items": items }));
        return Ok(());
    }
    let names: HashMap<String, String> =
        all::<NodeView>(c, "/api/v1/nodes").await?.into_iter().map(|n| (n.id, n.name)).collect();
    let wide = out == Output::Wide;
    let mut header = vec!["AGENT", "REVISION", "NODE", "REPLICAS", "STATUS", "REASON"];
    if wide {
        header.push("NODE ID");
    }
    let mut t = Table::new(&header);
    for p in &items {
        let node = p.node_id.as_ref().map(|id| names.get(id).cloned().unwrap_or_else(|| id.clone()));
        let status = json!(p.status);
        let mut row = vec![
            p.agent_key.clone(),
            p.revision.to_string(),
            or_dash(node),
            p.replicas.to_string(),
            status.as_str().unwrap_or_default().to_string(),
            or_dash(p.reason.as_ref()),
        ];
        if wide {
            row.push(or_dash(p.node_id.as_ref()));
        }
        t.row(row);
    }
    print!("{}", t.render());
    Ok(())
}

pub async fn why(c: &Client, out: Output, agent: &str, nodes: bool) -> Result<()> {
    let q = if nodes { "?nodes=true" } else { "" };
    let e: PlacementExplanation = c.get(&format!("/api/v1/agents/{}/placement{q}", enc(agent))).await?;
    if out == Output::Json {
        print_json(&e);
        return Ok(());
    }
    println!("Agent:      {} (revision {})", e.agent_key, e.revision);
    println!("Phase:      {}", e.phase);
    if let Some(r) = &e.reason {
        println!("Reason:     {} — {}", r.code, r.message);
    }
    if let Some(h) = &e.hint {
        println!("Hint:       {h}");
    }
    let ready = e.replicas.iter().filter(|r| r.state == "running").count();
    println!("Replicas:   {ready}/{} running", e.desired_replicas);
    if let Some(sp) = &e.spread {
        let counts: Vec<String> = sp
            .counts
            .iter()
            .map(|(v, n)| format!("{}={n}", if v.is_empty() { "(none)" } else { v.as_str() }))
            .collect();
        println!("Spread:     over {}: {}", sp.label, if counts.is_empty() { "-".into() } else { counts.join(", ") });
    }
    if e.priority != 0 {
        println!("Priority:   {}", e.priority);
    }
    for p in &e.problems {
        println!("Problem:    {p}");
    }
    let mut t = Table::new(&["REPLICA", "NODE", "STATE", "BUSY UNTIL", "MESSAGE"]);
    for r in &e.replicas {
        t.row(vec![
            r.replica.to_string(),
            or_dash(r.node.as_ref()),
            r.state.clone(),
            or_dash(r.busy_until.as_ref()),
            or_dash(r.message.as_ref()),
        ]);
    }
    println!();
    print!("{}", t.render());
    if !e.filters.is_empty() {
        println!();
        print!("{}", filters_table(&e.filters).render());
    }
    if let Some(verdicts) = &e.nodes {
        let mut t = Table::new(&["NODE", "FITS", "REASON", "DETAIL"]);
        for v in verdicts {
            t.row(vec![
                v.name.clone(),
                if v.fits { "yes" } else { "no" }.into(),
                or_dash(v.reason.as_ref()),
                or_dash(v.detail.as_ref()),
            ]);
        }
        println!();
        print!("{}", t.render());
    }
    Ok(())
}

/// The placement filters in order, with how many nodes each excluded and why.
fn filters_table(filters: &[fleet_api::FilterCount]) -> Table {
    let mut f = Table::new(&["FILTER", "NODES BEFORE", "EXCLUDED", "DETAIL"]);
    for c in filters {
        let mut detail: Vec<String> =
            c.missing.iter().flatten().filter(|(_, n)| **n > 0).map(|(what, n)| format!("{n} lack {what}")).collect();
        if let Some(x) = &c.exhausted {
            for (n, what) in [(x.slots, "slots"), (x.cpus, "cpus"), (x.memory_mb, "memory")] {
                if n > 0 {
                    detail.push(format!("{n} short of {what}"));
                }
            }
        }
        f.row(vec![c.filter.clone(), c.before.to_string(), c.excluded.to_string(), or_dash(Some(detail.join(", ")))]);
    }
    f
}

pub struct EventsQuery<'a> {
    pub agent: Option<&'a str>,
    pub node: Option<&'a str>,
    pub follow: bool,
    pub from: EventsFrom,
}

/// Where `fleetctl events` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsFrom {
    /// The last this many (what an admin asking "what just happened" wants).
    Last(u32),
    /// Every event after this seq (0: all that are kept).
    Seq(u64),
}

/// How many events `fleetctl events` shows without `--all` or `--since`.
pub const LAST_EVENTS: u32 = 50;

pub async fn events(c: &Client, out: Output, q: EventsQuery<'_>) -> Result<()> {
    let mut filter = String::new();
    if let Some(a) = q.agent {
        filter.push_str(&format!("&agent={}", enc(a)));
    }
    if let Some(n) = q.node {
        filter.push_str(&format!("&node={}", enc(n)));
    }
    let mut header_done = false;
    let mut since = match q.from {
        EventsFrom::Seq(s) => i64::try_from(s).unwrap_or(i64::MAX),
        EventsFrom::Last(n) => {
            // The newest n, printed oldest first; following goes on after the newest.
            let mut page: List<EventView> = c.get(&format!("/api/v1/events?order=desc&limit={n}{filter}")).await?;
            page.items.reverse();
            print_events(&page.items, out, &mut header_done);
            if page.next_cursor.is_some() && out != Output::Json {
                eprintln!("(the last {n} events; --all shows every one kept, --since SEQ those after SEQ)");
            }
            page.items.last().map_or(0, |e| e.seq)
        }
    };
    if matches!(q.from, EventsFrom::Last(_)) && !q.follow {
        return Ok(());
    }
    loop {
        let page: List<EventView> = c.get(&format!("/api/v1/events?since={since}{filter}")).await?;
        let full = page.next_cursor.is_some();
        if let Some(last) = page.items.last() {
            since = last.seq;
        }
        print_events(&page.items, out, &mut header_done);
        if full {
            continue; // more are waiting: read on at once
        }
        if !q.follow {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn print_events(items: &[EventView], out: Output, header_done: &mut bool) {
    if out == Output::Json {
        for e in items {
            println!("{}", serde_json::to_string(e).unwrap_or_default());
        }
        return;
    }
    let mut t = Table::new(&["SEQ", "AT", "KIND", "AGENT", "NODE", "REPLICA", "MESSAGE"]);
    for e in items {
        t.row(vec![
            e.seq.to_string(),
            e.at.clone(),
            e.kind.clone(),
            or_dash(e.agent_key.as_ref()),
            or_dash(e.node.as_ref()),
            or_dash(e.replica),
            e.message.clone(),
        ]);
    }
    let text = t.render();
    // Followed pages keep the columns of their own page; the header is printed once.
    let body = if *header_done { text.split_once('\n').map(|x| x.1).unwrap_or("") } else { &text };
    if !items.is_empty() || !*header_done {
        print!("{body}");
        let _ = std::io::stdout().flush();
        *header_done = true;
    }
}

pub async fn lifecycle_action(c: &Client, out: Output, node: &str, action: &str) -> Result<()> {
    let n: NodeView = c.post(&format!("/api/v1/nodes/{}:{action}", enc(node)), json!({})).await?;
    if out == Output::Json {
        print_json(&n);
    } else {
        println!("node {} {action}ed", n.name);
    }
    Ok(())
}

/// `fleetctl allow`: `PUT /api/v1/nodes/{id}/allowed` (docs/behaviour.md#what-a-node-may-claim).
pub async fn allow(c: &Client, out: Output, node: &str, labels: &[String], kinds: &[String]) -> Result<()> {
    let mut body = json!({});
    if !labels.is_empty() {
        body["allowedLabels"] = json!(labels);
    }
    if !kinds.is_empty() {
        body["allowedKinds"] = json!(kinds);
    }
    let n: NodeView = c.put(&format!("/api/v1/nodes/{}/allowed", enc(node)), body).await?;
    if out == Output::Json {
        print_json(&n);
        return Ok(());
    }
    let any = |l: &Option<Vec<String>>| l.as_ref().map_or("any".to_string(), |l| l.join(", "));
    println!("node {} may claim labels {}; kinds {}", n.name, any(&n.allowed_labels), any(&n.allowed_kinds));
    if !n.refused_facts.is_empty() {
        println!("refused now: {}", n.refused_facts.describe());
    }
    Ok(())
}

pub struct DrainOptions {
    pub force: bool,
    pub wait: bool,
    pub timeout: Duration,
}

pub async fn drain(c: &Client, out: Output, node: &str, o: DrainOptions) -> Result<()> {
    let path = format!("/api/v1/nodes/{}", enc(node));
    let mut n: NodeView = c.post(&format!("{path}:drain"), json!({ "force": o.force })).await?;
    if !o.wait {
        if out == Output::Json {
            print_json(&n);
        } else {
            println!("node {} draining: {}", n.name, progress(&n));
        }
        return Ok(());
    }
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    loop {
        let line = format!("draining {}: {}", n.name, progress(&n));
        if tty {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
        if n.drain.as_ref().is_some_and(|d| d.remaining == 0) {
            if tty {
                eprintln!();
            }
            println!("node {} drained", n.name);
            return Ok(());
        }
        if start.elapsed() > o.timeout {
            if tty {
                eprintln!();
            }
            let blocked = n.drain.as_ref().map(|d| d.blocked.as_slice()).unwrap_or_default();
            let hint = if blocked.iter().any(|b| b.reason != "budget") {
                " (blocked replicas have nowhere else to go: add room, or drain --force)"
            } else if !blocked.is_empty() {
                " (replicas wait for their agent's disruption budget: see `fleetctl rollout status`, or drain --force)"
            } else {
                ""
            };
            return Err(CallError(format!("the drain of {} did not finish in {:?}{hint}", n.name, o.timeout)));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        n = c.get::<NodeDetail>(&path).await?.node;
    }
}

fn progress(n: &NodeView) -> String {
    match &n.drain {
        Some(d) if d.remaining == 0 => "no replica left".into(),
        Some(d) if !d.blocked.is_empty() => {
            let budget = d.blocked.iter().filter(|b| b.reason == "budget").count();
            let nowhere = d.blocked.len() - budget;
            let mut parts = Vec::new();
            if nowhere > 0 {
                parts.push(format!("{nowhere} blocked (nowhere else to go)"));
            }
            if budget > 0 {
                parts.push(format!("{budget} waiting for the budget"));
            }
            format!("{} replicas left, {}", d.remaining, parts.join(", "))
        }
        Some(d) => format!("{} replicas left", d.remaining),
        None => "not draining".into(),
    }
}

pub async fn delete(c: &Client, node: &str, yes: bool) -> Result<()> {
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(CallError(format!(
                "refusing to delete {node} without confirmation: stdin is not a terminal; pass --yes"
            )));
        }
        eprint!("Delete node {node}? Its token stops working, every PAT sealed to it is revoked now and its replicas move. [y/N] ");
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("not deleted");
            return Ok(());
        }
    }
    c.delete(&format!("/api/v1/nodes/{}", enc(node))).await?;
    println!("node {node} deleted");
    Ok(())
}

/// `fleetctl join-key`: the key on stdout. `--allow-label`/`--allow-kind` limit what the node
/// may claim (docs/behaviour.md#what-a-node-may-claim); a flag not given allows anything.
pub async fn join_key(
    c: &Client,
    out: Output,
    ttl: Option<u64>,
    note: Option<&str>,
    allow_labels: &[String],
    allow_kinds: &[String],
) -> Result<()> {
    let mut body = json!({});
    if let Some(t) = ttl {
        body["ttlSeconds"] = json!(t);
    }
    if let Some(n) = note {
        body["note"] = json!(n);
    }
    if !allow_labels.is_empty() {
        body["allowedLabels"] = json!(allow_labels);
    }
    if !allow_kinds.is_empty() {
        body["allowedKinds"] = json!(allow_kinds);
    }
    let k: JoinKeyResponse = c.post("/api/v1/join-keys", body).await?;
    if out == Output::Json {
        print_json(&k);
    } else {
        println!("{}", k.join_key);
        eprintln!("expires {}; shown once: write it to the file node.yaml's joinKeyFile names", k.expires_at);
    }
    Ok(())
}

/// `fleetctl join-keys`: what each key was for and what became of it.
pub async fn join_keys(c: &Client, out: Output) -> Result<()> {
    let list: List<JoinKeyView> = c.get("/api/v1/join-keys").await?;
    if out == Output::Json {
        print_json(&json!({ "items": list.items }));
        return Ok(());
    }
    let mut t = Table::new(&["ID", "STATE", "NOTE", "CREATED", "EXPIRES", "NODE"]);
    for k in &list.items {
        let note = crate::clean::text(&k.note);
        t.row(vec![
            k.id.clone(),
            k.state.clone(),
            note,
            k.created_at.clone(),
            k.expires_at.clone(),
            or_dash(k.node_id.as_ref()),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

/// `fleetctl revoke-join-key <id>`.
pub async fn revoke_join_key(c: &Client, id: &str) -> Result<()> {
    c.delete(&format!("/api/v1/join-keys/{}", enc(id))).await?;
    println!("join key {id} revoked: no node joins with it any more");
    Ok(())
}
