//! Controller configuration from the environment (docs/reference.md#controller-environment). Defaults live here and only
//! here; every missing or malformed variable is reported at once, by name.

use std::net::SocketAddr;
use std::time::Duration;

/// Where the store lives; all the `join-key` command needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    pub data_dir: String,
    pub database_url: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    pub store: StoreConfig,
    pub control_plane_url: String,
    pub iam_url: String,
    pub iam_issuer: String,
    pub iam_tenant: String,
    pub jwks_url: String,
    /// `None` → every route but `/healthz` answers `503 not_configured`.
    pub credentials: Option<ClientCredentials>,
    pub audience: String,
    pub token_audiences: Vec<String>,
    pub token_scopes: Vec<String>,
    pub token_ttl_seconds: u64,
    pub reconcile_every: Duration,
    pub node_offline_after: Duration,
    /// [ext] `FLEET_NODE_GC_SECONDS`: a node offline longer than this is deleted (docs/behaviour.md#node-lifecycle);
    /// `None` (0, the default) keeps offline nodes until an admin deletes them.
    pub node_gc_after: Option<Duration>,
    pub token_revoke_grace: Duration,
    /// [ext] How often the JWKS of admin tokens is fetched again (docs/behaviour.md#hardening: 10 minutes).
    pub jwks_refresh: Duration,
    /// [ext] `FLEET_MAX_CONNECTIONS`: connections the API port holds at once (docs/behaviour.md#hardening).
    pub max_connections: usize,
    /// [ext] `FLEET_MAX_CONNECTIONS_PER_IP`: connections one client address holds at once on
    /// the API port; 0, the default, is no limit (docs/behaviour.md#hardening).
    pub max_connections_per_ip: u32,
    /// [ext] `FLEET_UNAUTH_BUFFER_BYTES`: bytes held for peers not yet authenticated, all
    /// together (docs/behaviour.md#hardening).
    pub unauth_buffer_bytes: usize,
    /// [ext] `FLEET_TRUSTED_PROXIES`: proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<crate::cidr::Cidr>,
    /// [ext] `FLEET_CA_FILE`: CAs trusted for outbound TLS besides the built-in roots.
    pub ca_certs: Vec<reqwest::Certificate>,
    /// `FLEET_KUBERNETES_MIRROR`, `FLEET_KUBERNETES_NAMESPACE`, `FLEET_ID`.
    pub kubernetes: KubernetesConfig,
    pub log_format: LogFormat,
    /// Header-read and idle timeouts of both listeners ([ext] `FLEET_HTTP_HEADER_READ_SECONDS`,
    /// `FLEET_HTTP_IDLE_SECONDS`).
    pub http_timeouts: HttpTimeouts,
    /// [ext] `FLEET_LEADER_LEASE_SECONDS`: the leader lease's TTL on PostgreSQL (docs/behaviour.md#high-availability).
    pub leader_lease: Duration,
    /// [ext] `FLEET_REPLICA_NAME`: this replica's name in the lease and the notifications;
    /// the host name and a random suffix by default (unique per process).
    pub replica_name: String,
    /// [ext] `FLEET_ADVERTISE_URL`: where the other replicas reach this one's API (admin
    /// reads on a follower are answered by the leader); `http://127.0.0.1:<port>` by default.
    pub advertise_url: String,
    /// [ext] `FLEET_REPLICA_SECRET`: the key replicas sign forwarded admin reads with
    /// (docs/behaviour.md#high-availability); required on PostgreSQL, at least 32 bytes.
    pub replica_secret: Option<ReplicaSecret>,
    /// [ext] `FLEET_ROLLOUT_MAX_UNAVAILABLE`, `FLEET_ROLLOUT_MIN_READY_SECONDS`,
    /// `FLEET_ROLLOUT_PROGRESS_DEADLINE_SECONDS`: the rollout policy's defaults
    /// (docs/behaviour.md#rolling-out-a-change).
    pub rollout: fleet_api::rollout::RolloutDefaults,
    /// Nodes whose changed desired states a pass builds and stores together
    /// (`reconcile::pass::bodies`). Not a setting: the tests lower it so that a pass over a
    /// few nodes commits in chunks, as a fleet-wide change does at full scale.
    pub desired_nodes_at_once: usize,
    /// `FLEET_ROLLOUTS_AT_ONCE`: changed rollouts a pass commits and publishes together as
    /// its rollout phase goes (`reconcile::pass::rollout`); the tests lower it.
    pub rollouts_at_once: usize,
}

/// The Kubernetes mirror's settings (docs/behaviour.md#kubernetes-mirror); `fleet-controller dev`
/// reads them too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// `FLEET_KUBERNETES_MIRROR`: project the store into FleetNode / FleetPlacement objects.
    pub mirror: bool,
    /// `FLEET_KUBERNETES_NAMESPACE`; `None`: the client's namespace (the pod's, in a cluster).
    pub namespace: Option<String>,
    /// `FLEET_ID`: this fleet's id instead of the one kept in the store.
    pub fleet_id: Option<String>,
}

impl KubernetesConfig {
    /// The three variables alone, every bad one named.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<KubernetesConfig, ConfigError> {
        let mut r = Reader { get, problems: vec![] };
        let k = r.kubernetes();
        if r.problems.is_empty() {
            Ok(k)
        } else {
            Err(ConfigError(r.problems))
        }
    }

    pub fn from_env() -> Result<KubernetesConfig, ConfigError> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }
}

/// [`Config::desired_nodes_at_once`] outside the tests.
pub const DESIRED_NODES_AT_ONCE: usize = 500;

/// [`Config::rollouts_at_once`] by default.
pub const ROLLOUTS_AT_ONCE: usize = 2048;

/// `FLEET_REPLICA_SECRET`, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct ReplicaSecret(pub Vec<u8>);

impl std::fmt::Debug for ReplicaSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplicaSecret(<redacted>)")
    }
}

/// The HTTP listeners' timeouts (`http::serve`).
#[derive(Debug, Clone, Copy)]
pub struct HttpTimeouts {
    /// Whole request head must arrive within this.
    pub header_read: Duration,
    /// No byte read or written for this long closes the connection.
    pub idle: Duration,
}

impl Default for HttpTimeouts {
    fn default() -> Self {
        HttpTimeouts {
            header_read: Duration::from_secs(defaults::HTTP_HEADER_READ_SECONDS),
            idle: Duration::from_secs(defaults::HTTP_IDLE_SECONDS),
        }
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct ClientCredentials {
    pub client_id: String,
    pub client_secret: String,
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("client_id", &self.client_id)
            .field("client_secret", &"<redacted>")
            .finish()
    }
}

/// Every problem found, one per line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("configuration: {}", .0.join("; "))]
pub struct ConfigError(pub Vec<String>);

pub mod defaults {
    pub const LISTEN: &str = "0.0.0.0:8040";
    pub const METRICS_LISTEN: &str = "0.0.0.0:9040";
    pub const DATA_DIR: &str = "/data";
    pub const AUDIENCE: &str = "fleet";
    pub const TOKEN_TTL_SECONDS: u64 = 604_800;
    pub const TOKEN_TTL_MIN: u64 = 3600;
    pub const TOKEN_TTL_MAX: u64 = 604_800;
    pub const RECONCILE_SECONDS: u64 = 5;
    pub const NODE_OFFLINE_SECONDS: u64 = 60;
    pub const NODE_GC_SECONDS: u64 = 0;
    pub const TOKEN_REVOKE_GRACE_SECONDS: u64 = 600;
    pub const JWKS_REFRESH_SECONDS: u64 = 600;
    pub const MAX_CONNECTIONS: u64 = 40_000;
    /// Off: behind an ingress every node shares the ingress's address.
    pub const MAX_CONNECTIONS_PER_IP: u64 = 0;
    /// 16 MiB: a quarter of what 2,000 heads of 64 KiB would hold, and room for 50,000 heads
    /// of a node's few hundred bytes.
    pub const UNAUTH_BUFFER_BYTES: u64 = 16 << 20;
    /// hyper also runs this timer while a keep-alive connection waits for its next request,
    /// so it is the keep-alive limit too: above the nodes' 20 s report period, so a node's
    /// connection is reused rather than reopened for every report.
    pub const HTTP_HEADER_READ_SECONDS: u64 = 30;
    /// Above the longest long-poll (60 s), which sends nothing while it waits.
    pub const HTTP_IDLE_SECONDS: u64 = 300;
    pub const LEADER_LEASE_SECONDS: u64 = 15;
}

struct Reader<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
    problems: Vec<String>,
}

impl Reader<'_> {
    fn opt(&self, name: &str) -> Option<String> {
        (self.get)(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    fn or(&self, name: &str, default: &str) -> String {
        self.opt(name).unwrap_or_else(|| default.to_string())
    }

    fn addr(&mut self, name: &str, default: &str) -> SocketAddr {
        let v = self.or(name, default);
        v.parse().unwrap_or_else(|_| {
            self.problems.push(format!("{name}={v:?} is not an address like 0.0.0.0:8040"));
            default.parse().expect("default address parses")
        })
    }

    fn seconds(&mut self, name: &str, default: u64, min: u64, max: u64) -> u64 {
        self.number(name, default, min, max, " of seconds")
    }

    /// A whole number in `min..=max`; `unit` completes the message ("of seconds").
    fn number(&mut self, name: &str, default: u64, min: u64, max: u64, unit: &str) -> u64 {
        let Some(v) = self.opt(name) else { return default };
        match v.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => n,
            _ => {
                self.problems.push(format!("{name}={v:?} must be a whole number{unit} from {min} to {max}"));
                default
            }
        }
    }

    fn url(&mut self, name: &str, missing: &mut Vec<&'static str>, static_name: &'static str) -> String {
        match self.opt(name) {
            None => {
                missing.push(static_name);
                String::new()
            }
            Some(v) if v.starts_with("http://") || v.starts_with("https://") => v.trim_end_matches('/').to_string(),
            Some(v) => {
                self.problems.push(format!("{name}={v:?} must be an http:// or https:// URL"));
                String::new()
            }
        }
    }

    /// docs/behaviour.md#hardening for the controller's outbound calls: plain http:// only to loopback hosts
    /// (unless `FLEET_ALLOW_INSECURE_HTTP=true`), and the CAs of `FLEET_CA_FILE`.
    fn outbound_tls(&mut self, urls: &[(&str, &String)]) -> Vec<reqwest::Certificate> {
        let allow_insecure = self.flag("FLEET_ALLOW_INSECURE_HTTP");
        for (name, url) in urls {
            if !allow_insecure && fleet_api::urls::is_insecure(url) {
                self.problems.push(format!(
                    "{name}={url:?}: plain http:// is allowed only for loopback hosts; use https:// (FLEET_CA_FILE \
                     adds a CA) or set FLEET_ALLOW_INSECURE_HTTP=true"
                ));
            }
        }
        match self.opt("FLEET_CA_FILE") {
            None => Vec::new(),
            Some(p) => read_ca_file(std::path::Path::new(&p)).unwrap_or_else(|e| {
                self.problems.push(format!("FLEET_CA_FILE: {e}"));
                Vec::new()
            }),
        }
    }

    /// A boolean: `true`/`1` or `false`/`0`, false when unset.
    fn flag(&mut self, name: &str) -> bool {
        match self.opt(name).as_deref() {
            None | Some("false") | Some("0") => false,
            Some("true") | Some("1") => true,
            Some(v) => {
                self.problems.push(format!("{name}={v:?} must be true or false"));
                false
            }
        }
    }

    fn log_format(&mut self) -> LogFormat {
        match self.opt("FLEET_LOG_FORMAT").as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(v) => {
                self.problems.push(format!("FLEET_LOG_FORMAT={v:?} must be text or json"));
                LogFormat::Text
            }
        }
    }

    /// `FLEET_TRUSTED_PROXIES`: CIDRs or addresses, comma-separated; each bad one named.
    fn trusted_proxies(&mut self) -> Vec<crate::cidr::Cidr> {
        let Some(v) = self.opt("FLEET_TRUSTED_PROXIES") else { return Vec::new() };
        let mut blocks = Vec::new();
        for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match crate::cidr::Cidr::parse(part) {
                Some(c) => blocks.push(c),
                None => self
                    .problems
                    .push(format!("FLEET_TRUSTED_PROXIES: {part:?} is not a CIDR like 10.0.0.0/8 or an address")),
            }
        }
        blocks
    }

    /// The mirror's switch, namespace and fleet id, each name checked as Kubernetes checks it.
    fn kubernetes(&mut self) -> KubernetesConfig {
        let mirror = self.flag("FLEET_KUBERNETES_MIRROR");
        let namespace = self.opt("FLEET_KUBERNETES_NAMESPACE");
        if let Some(ns) = namespace.as_deref().filter(|ns| !fleet_api::names::is_dns_label(ns)) {
            self.problems.push(format!(
                "FLEET_KUBERNETES_NAMESPACE={ns:?} is not a namespace name (lowercase letters, digits and '-', \
                 at most 63)"
            ));
        }
        let fleet_id = self.opt("FLEET_ID");
        if let Some(id) = fleet_id.as_deref().filter(|id| !fleet_api::names::is_kubernetes_label_value(id)) {
            self.problems.push(format!(
                "FLEET_ID={id:?} is not a Kubernetes label value (letters, digits, '-', '_' and '.', starting and \
                 ending with a letter or digit, at most 63)"
            ));
        }
        KubernetesConfig { mirror, namespace, fleet_id }
    }

    fn http_timeouts(&mut self) -> HttpTimeouts {
        let header_read = self.seconds("FLEET_HTTP_HEADER_READ_SECONDS", defaults::HTTP_HEADER_READ_SECONDS, 1, 300);
        let idle = self.seconds("FLEET_HTTP_IDLE_SECONDS", defaults::HTTP_IDLE_SECONDS, 1, 86_400 * 365);
        HttpTimeouts { header_read: Duration::from_secs(header_read), idle: Duration::from_secs(idle) }
    }
}

/// The certificates of a PEM bundle, for `FLEET_CA_FILE`.
pub fn read_ca_file(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The host name (the pod's name in Kubernetes) and a random suffix, so two processes on one
/// host are two replicas.
fn default_replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let suffix: u32 = rand::random();
    format!("{}-{:08x}", if host.is_empty() { "fleet-controller" } else { host }, suffix)
}

/// A database URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

impl StoreConfig {
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> StoreConfig {
        let r = Reader { get, problems: vec![] };
        let data_dir = r.or("FLEET_DATA_DIR", defaults::DATA_DIR);
        let database_url = r
            .opt("FLEET_DATABASE_URL")
            .unwrap_or_else(|| format!("sqlite://{}/fleet.sqlite", data_dir.trim_end_matches('/')));
        StoreConfig { data_dir, database_url }
    }

    pub fn from_env() -> StoreConfig {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }
}

impl Config {
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Every variable read at once: a bad value is named with every other problem, not one
    /// start-up at a time.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut r = Reader { get, problems: vec![] };
        let mut missing = Vec::new();
        let listen = r.addr("FLEET_LISTEN", defaults::LISTEN);
        let metrics_listen = r.addr("FLEET_METRICS_LISTEN", defaults::METRICS_LISTEN);
        let platform = r.platform(&mut missing);
        let tokens = r.tokens();
        let timing = r.timing();
        let http_timeouts = r.http_timeouts();
        let outbound = [
            ("FLEET_CONTROL_PLANE_URL", &platform.control_plane_url),
            ("FLEET_IAM_URL", &platform.iam_url),
            ("FLEET_JWKS_URL", &platform.jwks_url),
        ];
        let ca_certs = r.outbound_tls(&outbound);
        let limits = r.limits();
        let trusted_proxies = r.trusted_proxies();
        let kubernetes = r.kubernetes();
        let log_format = r.log_format();
        let (replica_name, advertise_url) = r.replica(listen);
        let store = StoreConfig::from_lookup(get);
        let replica_secret = r.replica_secret(&store);
        let rollout = r.rollout();
        let rollouts_at_once =
            r.number("FLEET_ROLLOUTS_AT_ONCE", ROLLOUTS_AT_ONCE as u64, 1, 1_000_000, " of rollouts") as usize;
        let mut problems = Vec::new();
        if !missing.is_empty() {
            problems.push(format!("missing required variables: {}", missing.join(", ")));
        }
        problems.extend(r.problems);
        if !problems.is_empty() {
            return Err(ConfigError(problems));
        }
        let Platform { control_plane_url, iam_url, iam_issuer, iam_tenant, jwks_url, credentials, audience } = platform;
        let Tokens { token_audiences, token_scopes, token_ttl_seconds } = tokens;
        let Timing {
            reconcile_every,
            node_offline_after,
            node_gc_after,
            token_revoke_grace,
            jwks_refresh,
            leader_lease,
        } = timing;
        let Limits { max_connections, max_connections_per_ip, unauth_buffer_bytes } = limits;
        Ok(Config {
            listen,
            metrics_listen,
            store,
            control_plane_url,
            iam_url,
            iam_issuer,
            iam_tenant,
            jwks_url,
            credentials,
            audience,
            token_audiences,
            token_scopes,
            token_ttl_seconds,
            reconcile_every,
            node_offline_after,
            node_gc_after,
            token_revoke_grace,
            jwks_refresh,
            ca_certs,
            max_connections,
            max_connections_per_ip,
            unauth_buffer_bytes,
            trusted_proxies,
            kubernetes,
            log_format,
            http_timeouts,
            leader_lease,
            replica_name,
            advertise_url,
            replica_secret,
            rollout,
            desired_nodes_at_once: DESIRED_NODES_AT_ONCE,
            rollouts_at_once,
        })
    }
}

/// Where the CP and IAM are, and who the controller is to them.
struct Platform {
    control_plane_url: String,
    iam_url: String,
    iam_issuer: String,
    iam_tenant: String,
    jwks_url: String,
    credentials: Option<ClientCredentials>,
    audience: String,
}

/// The ceiling of the PATs the controller asks for.
struct Tokens {
    token_audiences: Vec<String>,
    token_scopes: Vec<String>,
    token_ttl_seconds: u64,
}

/// The periods and thresholds of the controller's timed work.
struct Timing {
    reconcile_every: Duration,
    node_offline_after: Duration,
    node_gc_after: Option<Duration>,
    token_revoke_grace: Duration,
    jwks_refresh: Duration,
    leader_lease: Duration,
}

/// What the HTTP side holds open at once.
struct Limits {
    max_connections: usize,
    max_connections_per_ip: u32,
    unauth_buffer_bytes: usize,
}

impl Reader<'_> {
    fn limits(&mut self) -> Limits {
        let max_connections =
            self.number("FLEET_MAX_CONNECTIONS", defaults::MAX_CONNECTIONS, 16, 10_000_000, "") as usize;
        let per_ip = defaults::MAX_CONNECTIONS_PER_IP;
        let max_connections_per_ip = self.number("FLEET_MAX_CONNECTIONS_PER_IP", per_ip, 0, 10_000_000, "") as u32;
        let unauth = defaults::UNAUTH_BUFFER_BYTES;
        let unauth_buffer_bytes =
            self.number("FLEET_UNAUTH_BUFFER_BYTES", unauth, 1 << 20, 1 << 40, " of bytes") as usize;
        Limits { max_connections, max_connections_per_ip, unauth_buffer_bytes }
    }

    /// The platform's addresses; a required one that is unset goes to `missing`.
    fn platform(&mut self, missing: &mut Vec<&'static str>) -> Platform {
        let control_plane_url = self.url("FLEET_CONTROL_PLANE_URL", missing, "FLEET_CONTROL_PLANE_URL");
        let iam_url = self.url("FLEET_IAM_URL", missing, "FLEET_IAM_URL");
        let mut required = |name: &'static str, v: Option<String>| {
            v.unwrap_or_else(|| {
                missing.push(name);
                String::new()
            })
        };
        let iam_issuer = required("FLEET_IAM_ISSUER", self.opt("FLEET_IAM_ISSUER"));
        let iam_tenant = required("FLEET_IAM_TENANT", self.opt("FLEET_IAM_TENANT"));
        let jwks_url = self.url("FLEET_JWKS_URL", missing, "FLEET_JWKS_URL");
        let credentials = match (self.opt("FLEET_CLIENT_ID"), self.opt("FLEET_CLIENT_SECRET")) {
            (Some(client_id), Some(client_secret)) => Some(ClientCredentials { client_id, client_secret }),
            _ => None,
        };
        let audience = self.or("FLEET_AUDIENCE", defaults::AUDIENCE);
        Platform { control_plane_url, iam_url, iam_issuer, iam_tenant, jwks_url, credentials, audience }
    }

    fn tokens(&mut self) -> Tokens {
        let split = |v: Option<String>| -> Vec<String> {
            v.map(|s| s.split_whitespace().map(str::to_string).collect()).unwrap_or_default()
        };
        let token_audiences = split(self.opt("FLEET_TOKEN_AUDIENCES"));
        let token_scopes = split(self.opt("FLEET_TOKEN_SCOPES"));
        let token_ttl_seconds = self.seconds(
            "FLEET_TOKEN_TTL_SECONDS",
            defaults::TOKEN_TTL_SECONDS,
            defaults::TOKEN_TTL_MIN,
            defaults::TOKEN_TTL_MAX,
        );
        Tokens { token_audiences, token_scopes, token_ttl_seconds }
    }

    fn timing(&mut self) -> Timing {
        let day = 86_400 * 365;
        let mut secs =
            |name: &str, default: u64, min: u64, max: u64| Duration::from_secs(self.seconds(name, default, min, max));
        let reconcile_every = secs("FLEET_RECONCILE_SECONDS", defaults::RECONCILE_SECONDS, 1, day);
        let node_offline_after = secs("FLEET_NODE_OFFLINE_SECONDS", defaults::NODE_OFFLINE_SECONDS, 1, day);
        let gc = secs("FLEET_NODE_GC_SECONDS", defaults::NODE_GC_SECONDS, 0, day);
        let node_gc_after = (!gc.is_zero()).then_some(gc);
        let token_revoke_grace = secs("FLEET_TOKEN_REVOKE_GRACE_SECONDS", defaults::TOKEN_REVOKE_GRACE_SECONDS, 1, day);
        let jwks_refresh = secs("FLEET_JWKS_REFRESH_SECONDS", defaults::JWKS_REFRESH_SECONDS, 1, day);
        let leader_lease = secs("FLEET_LEADER_LEASE_SECONDS", defaults::LEADER_LEASE_SECONDS, 3, 600);
        Timing { reconcile_every, node_offline_after, node_gc_after, token_revoke_grace, jwks_refresh, leader_lease }
    }

    /// The rollout policy's defaults.
    fn rollout(&mut self) -> fleet_api::rollout::RolloutDefaults {
        let d = fleet_api::rollout::RolloutDefaults::default();
        let max_unavailable = match self.opt("FLEET_ROLLOUT_MAX_UNAVAILABLE") {
            None => d.max_unavailable,
            Some(v) => {
                fleet_api::rollout::MaxUnavailable::parse(&serde_json::Value::String(v.clone())).unwrap_or_else(|| {
                    self.problems.push(format!(
                        "FLEET_ROLLOUT_MAX_UNAVAILABLE={v:?} must be a number of replicas or a percentage up to 100%"
                    ));
                    d.max_unavailable
                })
            }
        };
        let week = 7 * 86_400;
        let mut secs =
            |name: &str, default: u32, min: u64, max: u64| self.seconds(name, default.into(), min, max) as u32;
        let min_ready_seconds = secs("FLEET_ROLLOUT_MIN_READY_SECONDS", d.min_ready_seconds, 0, week);
        let progress_deadline_seconds =
            secs("FLEET_ROLLOUT_PROGRESS_DEADLINE_SECONDS", d.progress_deadline_seconds, 1, week);
        let cap = fleet_api::rollout::MAX_BUSY_SECONDS.into();
        let max_busy_seconds = secs("FLEET_ROLLOUT_MAX_BUSY_SECONDS", d.max_busy_seconds, 0, cap);
        fleet_api::rollout::RolloutDefaults {
            max_unavailable,
            min_ready_seconds,
            progress_deadline_seconds,
            max_busy_seconds,
        }
    }

    /// This replica's name and the URL other replicas forward to it by.
    fn replica(&mut self, listen: SocketAddr) -> (String, String) {
        let replica_name = self.opt("FLEET_REPLICA_NAME").unwrap_or_else(default_replica_name);
        if replica_name.contains(char::is_whitespace) {
            self.problems.push(format!("FLEET_REPLICA_NAME={replica_name:?} must not contain spaces"));
        }
        let advertise_url = match self.opt("FLEET_ADVERTISE_URL") {
            None => format!("http://127.0.0.1:{}", listen.port()),
            Some(v) if v.starts_with("http://") || v.starts_with("https://") => v.trim_end_matches('/').to_string(),
            Some(v) => {
                self.problems.push(format!("FLEET_ADVERTISE_URL={v:?} must be an http:// or https:// URL"));
                String::new()
            }
        };
        (replica_name, advertise_url)
    }

    /// `FLEET_REPLICA_SECRET`: required with a PostgreSQL store, where followers forward.
    fn replica_secret(&mut self, store: &StoreConfig) -> Option<ReplicaSecret> {
        let secret = self.opt("FLEET_REPLICA_SECRET");
        let shared = store.database_url.starts_with("postgres");
        match &secret {
            None if shared => self.problems.push(
                "FLEET_REPLICA_SECRET is required with a PostgreSQL FLEET_DATABASE_URL: the replicas sign the \
                 admin reads they forward to the leader with it. Set the same random value of 32 characters or \
                 more on every replica (e.g. `openssl rand -hex 32`; the Helm chart generates one)"
                    .to_string(),
            ),
            Some(s) if s.len() < 32 => {
                self.problems.push(format!("FLEET_REPLICA_SECRET is {} characters; it needs 32 or more", s.len()))
            }
            _ => {}
        }
        secret.map(|s| ReplicaSecret(s.into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(&move |k| m.get(k).cloned())
    }

    /// Replicas on PostgreSQL forward admin reads signed with FLEET_REPLICA_SECRET: it is
    /// required there, long enough, and never shown by Debug.
    #[test]
    fn a_replica_secret_is_required_on_postgresql() {
        let base = [
            ("FLEET_CONTROL_PLANE_URL", "https://cp"),
            ("FLEET_IAM_URL", "https://iam"),
            ("FLEET_IAM_ISSUER", "https://iam"),
            ("FLEET_IAM_TENANT", "t"),
            ("FLEET_JWKS_URL", "https://iam/jwks"),
            ("FLEET_DATABASE_URL", "postgres://fleet@db/fleet"),
        ];
        let e = with(&base).unwrap_err().0.join("\n");
        assert!(e.contains("FLEET_REPLICA_SECRET is required with a PostgreSQL FLEET_DATABASE_URL"), "{e}");
        let short = [&base[..], &[("FLEET_REPLICA_SECRET", "short")]].concat();
        assert!(with(&short).unwrap_err().0.join("\n").contains("FLEET_REPLICA_SECRET is 5 characters; it needs 32"));
        let good = [&base[..], &[("FLEET_REPLICA_SECRET", "0123456789abcdef0123456789abcdef")]].concat();
        let c = with(&good).unwrap();
        assert!(!format!("{c:?}").contains("0123456789abcdef"), "not in Debug");
        assert!(with(&base[..5]).unwrap().replica_secret.is_none(), "SQLite needs none");
    }

    const BASE: &[(&str, &str)] = &[
        // Plain http:// to these hosts only because this says so (see `plain_http_...`).
        ("FLEET_ALLOW_INSECURE_HTTP", "true"),
        ("FLEET_CONTROL_PLANE_URL", "http://cp"),
        ("FLEET_IAM_URL", "http://iam/"),
        ("FLEET_IAM_ISSUER", "http://iam"),
        ("FLEET_IAM_TENANT", "t1"),
        ("FLEET_JWKS_URL", "http://iam/jwks"),
    ];

    #[test]
    fn defaults_apply() {
        let c = with(BASE).unwrap();
        assert_eq!(c.listen.to_string(), "0.0.0.0:8040");
        assert_eq!(c.metrics_listen.to_string(), "0.0.0.0:9040");
        assert_eq!(c.store.database_url, "sqlite:///data/fleet.sqlite");
        assert_eq!(c.iam_url, "http://iam");
        assert_eq!(c.audience, "fleet");
        assert_eq!(c.token_ttl_seconds, 604_800);
        assert_eq!(c.reconcile_every, Duration::from_secs(5));
        assert_eq!(c.node_offline_after, Duration::from_secs(60));
        assert_eq!(c.token_revoke_grace, Duration::from_secs(600));
        assert!(c.credentials.is_none());
        assert!(c.token_scopes.is_empty());
    }

    /// docs/behaviour.md#hardening: http:// only for loopback hosts unless FLEET_ALLOW_INSECURE_HTTP says so;
    /// each refused URL is named.
    #[test]
    fn plain_http_to_other_hosts_is_refused_naming_the_variable() {
        let vars = [
            ("FLEET_CONTROL_PLANE_URL", "http://127.0.0.1:8041"),
            ("FLEET_IAM_URL", "http://iam.example.com"),
            ("FLEET_IAM_ISSUER", "https://iam.example.com"),
            ("FLEET_IAM_TENANT", "t1"),
            ("FLEET_JWKS_URL", "http://iam.example.com/jwks"),
        ];
        let e = with(&vars).unwrap_err().to_string();
        assert!(
            e.contains("FLEET_IAM_URL=\"http://iam.example.com\": plain http:// is allowed only for loopback"),
            "{e}"
        );
        assert!(e.contains("FLEET_JWKS_URL="), "{e}");
        assert!(!e.contains("FLEET_CONTROL_PLANE_URL="), "loopback is fine: {e}");
        let mut allowed = vars.to_vec();
        allowed.push(("FLEET_ALLOW_INSECURE_HTTP", "true"));
        assert!(with(&allowed).is_ok());
        let mut bad_ca = allowed.clone();
        bad_ca.push(("FLEET_CA_FILE", "/nonexistent/ca.pem"));
        assert!(with(&bad_ca).unwrap_err().to_string().contains("FLEET_CA_FILE: cannot read /nonexistent/ca.pem"));
    }

    #[test]
    fn missing_are_listed_together() {
        let e = with(&[("FLEET_IAM_URL", "http://iam")]).unwrap_err();
        assert_eq!(
            e.0[0],
            "missing required variables: FLEET_CONTROL_PLANE_URL, FLEET_IAM_ISSUER, FLEET_IAM_TENANT, FLEET_JWKS_URL"
        );
    }

    #[test]
    fn bad_values_are_named() {
        let mut v = BASE.to_vec();
        v.push(("FLEET_TOKEN_TTL_SECONDS", "60"));
        v.push(("FLEET_RECONCILE_SECONDS", "0"));
        v.push(("FLEET_LISTEN", "nope"));
        v.push(("FLEET_LOG_FORMAT", "xml"));
        let e = with(&v).unwrap_err();
        let all = e.to_string();
        for name in ["FLEET_TOKEN_TTL_SECONDS", "FLEET_RECONCILE_SECONDS", "FLEET_LISTEN", "FLEET_LOG_FORMAT"] {
            assert!(all.contains(name), "{all}");
        }
    }

    /// The mirror's names are checked as Kubernetes checks them, each problem named at start.
    #[test]
    fn the_mirrors_namespace_and_fleet_id_are_kubernetes_names() {
        let mut v = BASE.to_vec();
        v.extend([
            ("FLEET_KUBERNETES_MIRROR", "true"),
            ("FLEET_KUBERNETES_NAMESPACE", "fleet-2"),
            ("FLEET_ID", "prod.eu"),
        ]);
        let k = with(&v).unwrap().kubernetes;
        assert_eq!(
            k,
            KubernetesConfig { mirror: true, namespace: Some("fleet-2".into()), fleet_id: Some("prod.eu".into()) }
        );
        let e = KubernetesConfig::from_lookup(&|k| match k {
            "FLEET_KUBERNETES_NAMESPACE" => Some("Fleet_2".into()),
            "FLEET_ID" => Some("a/b".into()),
            _ => None,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("FLEET_KUBERNETES_NAMESPACE=\"Fleet_2\" is not a namespace name"), "{e}");
        assert!(e.contains("FLEET_ID=\"a/b\" is not a Kubernetes label value"), "{e}");
        assert_eq!(with(BASE).unwrap().kubernetes, KubernetesConfig::default(), "off unless asked");
    }

    #[test]
    fn lists_and_credentials() {
        let mut v = BASE.to_vec();
        v.push(("FLEET_TOKEN_SCOPES", " control-plane:read  notification-service=notifications:send "));
        v.push(("FLEET_CLIENT_ID", "fleet"));
        v.push(("FLEET_CLIENT_SECRET", "s3cret"));
        v.push(("FLEET_DATA_DIR", "/tmp/x/"));
        let c = with(&v).unwrap();
        assert_eq!(c.token_scopes, vec!["control-plane:read", "notification-service=notifications:send"]);
        assert!(!format!("{:?}", c.credentials).contains("s3cret"));
        assert_eq!(c.store.database_url, "sqlite:///tmp/x/fleet.sqlite");
    }
}
