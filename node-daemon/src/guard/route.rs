//! Which Docker API calls the guard admits (docs/behaviour.md#packaging-and-the-docker-guard):
//! the routes fleet-node uses and nothing else, at an API version of 1.40 or later (older
//! versions take a `HostConfig` in the start body, past the create check).

use super::query::{Allowed, Query, Value};
pub use super::refusal::{refuse, Refusal};

/// The oldest API version admitted in a path.
const OLDEST: (u32, u32) = (1, 40);

/// What an admitted request is, for the proxy to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/_ping`, `/version`: forwarded as is.
    Plain(&'static str),
    /// `GET /containers/json`: the answer is cut to this node's containers.
    ListContainers,
    /// `GET /volumes`: the answer is cut to this node's volumes.
    ListVolumes,
    /// `POST /containers/create`: the body is checked and re-serialised.
    CreateContainer,
    /// `POST /volumes/create`: the body is checked and re-serialised.
    CreateVolume,
    /// Inspect, start, stop or remove one container, named as the client named it: only one
    /// of this node's, and forwarded by the engine's own id.
    Container(String, Action),
    /// `GET /images/{name}/json`: whether an image a kind may run is present (`checkBeforeStop`).
    InspectImage(String),
    /// `GET /fleet/v1/containers/{name}/busy`: the guard's own route, not the engine's: the
    /// busy lease of one of this node's containers, read from the lease directory the guard
    /// made for it (`crate::lease`).
    Busy(String),
}

/// The guard's own route for a container's busy lease.
pub fn busy_path(name: &str) -> String {
    format!("/fleet/v1/containers/{name}/busy")
}

/// What is done to one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Inspect,
    Start,
    Stop,
    Remove,
}

/// An admitted request: its route, the API version it named and its query, read once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub route: Route,
    /// `/v1.47`, or empty when the client named none.
    pub version: String,
    pub query: Query,
}

impl Route {
    /// Whether a request body is part of the call (elsewhere one is refused).
    pub fn takes_body(&self) -> bool {
        matches!(self, Route::CreateContainer | Route::CreateVolume)
    }

    /// The query keys this route admits.
    fn allowed(&self) -> Allowed {
        match self {
            Route::ListContainers => {
                &[("all", Value::Bool), ("filters", Value::Filters), ("limit", Value::Count), ("size", Value::Bool)]
            }
            Route::ListVolumes => &[("filters", Value::Filters)],
            Route::CreateContainer => &[("name", Value::Name), ("platform", Value::Empty)],
            Route::Container(_, Action::Inspect) => &[("size", Value::Bool)],
            Route::Container(_, Action::Stop) => &[("t", Value::Count)],
            Route::Container(_, Action::Remove) => {
                &[("force", Value::Bool), ("v", Value::Bool), ("link", Value::False)]
            }
            _ => &[],
        }
    }
}

impl Call {
    /// The path the engine gets, built by the guard: for a container call, `id` is the
    /// engine's full id of the container the client named.
    pub fn forward_path(&self, id: &str) -> String {
        let path = match &self.route {
            Route::Plain(p) => format!("/{p}"),
            Route::ListContainers => "/containers/json".into(),
            Route::ListVolumes => "/volumes".into(),
            Route::CreateContainer => "/containers/create".into(),
            Route::CreateVolume => "/volumes/create".into(),
            Route::Container(_, Action::Inspect) => format!("/containers/{id}/json"),
            Route::Container(_, Action::Start) => format!("/containers/{id}/start"),
            Route::Container(_, Action::Stop) => format!("/containers/{id}/stop"),
            Route::Container(_, Action::Remove) => format!("/containers/{id}"),
            Route::InspectImage(name) => format!("/images/{name}/json"),
            Route::Busy(_) => format!("/containers/{id}/json"),
        };
        format!("{}{path}{}", self.version, self.query.encoded())
    }
}

/// The routes fleet-node uses, with or without a `/v1.NN` version prefix, on a path in the
/// one form the guard reads (no empty, `.` or `..` segment, no escape: the engine's router
/// might clean or decode them otherwise than the guard), with the route's query read strictly.
pub fn route(method: &str, path: &str, query: Option<&str>) -> Result<Call, Refusal> {
    canonical(path)?;
    let (version, path) = strip_version(path)?;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let route = match (method, parts.as_slice()) {
        ("GET" | "HEAD", ["_ping"]) => Route::Plain("_ping"),
        ("GET", ["version"]) => Route::Plain("version"),
        ("GET", ["containers", "json"]) => Route::ListContainers,
        ("GET", ["volumes"]) => Route::ListVolumes,
        ("POST", ["containers", "create"]) => Route::CreateContainer,
        ("POST", ["volumes", "create"]) => Route::CreateVolume,
        ("GET", ["containers", id, "json"]) if is_container_ref(id) => {
            Route::Container(id.to_string(), Action::Inspect)
        }
        ("POST", ["containers", id, "start"]) if is_container_ref(id) => {
            Route::Container(id.to_string(), Action::Start)
        }
        ("POST", ["containers", id, "stop"]) if is_container_ref(id) => Route::Container(id.to_string(), Action::Stop),
        ("DELETE", ["containers", id]) if is_container_ref(id) => Route::Container(id.to_string(), Action::Remove),
        ("GET", ["fleet", "v1", "containers", id, "busy"]) if is_container_ref(id) && version.is_empty() => {
            Route::Busy(id.to_string())
        }
        ("GET", ["images", name @ .., "json"]) if is_image_ref(&name.join("/")) => Route::InspectImage(name.join("/")),
        _ => return refuse(format!("{method} {path} is not an endpoint fleet-node uses")),
    };
    let query = Query::read(query, route.allowed())?;
    Ok(Call { route, version: version.to_string(), query })
}

/// A path in its one form: absolute, no empty, `.` or `..` segment, no escape, no trailing `/`.
fn canonical(path: &str) -> Result<(), Refusal> {
    let Some(rest) = path.strip_prefix('/') else { return refuse(format!("the path {path:?} is not absolute")) };
    let bad = rest.split('/').any(|s| s.is_empty() || s == "." || s == "..") || path.contains('%');
    if bad {
        return refuse(format!("the path {path:?} is not in its plain form (no //, ., .. or escapes)"));
    }
    Ok(())
}

/// A container id or name as the node uses them: no encoded separators reach the engine.
pub fn is_container_ref(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// An image reference as node.yaml names them: no encoded separators, no `..`.
fn is_image_ref(name: &str) -> bool {
    !name.is_empty()
        && !name.contains("..")
        && !name.split('/').any(str::is_empty)
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':' | '/' | '@'))
}

/// The `/vX.Y` prefix and the path after it; a version below [`OLDEST`] is refused.
fn strip_version(path: &str) -> Result<(&str, &str), Refusal> {
    let Some(rest) = path.strip_prefix("/v") else { return Ok(("", path)) };
    let (version, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if version.is_empty() || !version.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Ok(("", path));
    }
    let mut parts = version.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor)), None) if (major, minor) >= OLDEST => Ok((&path[..version.len() + 2], tail)),
        (Some(Ok(_)), Some(Ok(_)), None) => refuse(format!(
            "API version v{version} is refused: versions below v1.40 accept a HostConfig when a container starts"
        )),
        _ => refuse(format!("API version v{version} is not a version")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(method: &str, path: &str) -> Result<Route, Refusal> {
        route(method, path, None).map(|c| c.route)
    }

    fn container(id: &str, action: Action) -> Result<Route, Refusal> {
        Ok(Route::Container(id.into(), action))
    }

    #[test]
    fn only_the_endpoints_fleet_node_uses_are_routed() {
        assert_eq!(r("GET", "/_ping"), Ok(Route::Plain("_ping")));
        assert_eq!(r("HEAD", "/v1.41/_ping"), Ok(Route::Plain("_ping")));
        assert_eq!(r("GET", "/v1.47/version"), Ok(Route::Plain("version")));
        let image = "registry.example.com/agent-runner:1.5";
        assert_eq!(r("GET", &format!("/v1.47/images/{image}/json")), Ok(Route::InspectImage(image.into())));
        assert!(r("GET", "/images/../containers/json").is_err());
        assert!(r("POST", "/images/a:1/json").is_err());
        assert!(r("DELETE", "/images/a:1").is_err());
        assert_eq!(r("GET", "/v1.41/containers/json"), Ok(Route::ListContainers));
        assert_eq!(r("GET", "/v1.41/volumes"), Ok(Route::ListVolumes));
        assert_eq!(r("POST", "/v1.41/containers/create"), Ok(Route::CreateContainer));
        assert_eq!(r("POST", "/volumes/create"), Ok(Route::CreateVolume));
        assert_eq!(r("GET", "/v1.41/containers/abc/json"), container("abc", Action::Inspect));
        assert_eq!(r("POST", "/v1.41/containers/abc/start"), container("abc", Action::Start));
        assert_eq!(r("POST", "/v1.41/containers/abc/stop"), container("abc", Action::Stop));
        assert_eq!(r("DELETE", "/v1.41/containers/abc"), container("abc", Action::Remove));
        assert_eq!(r("GET", "/fleet/v1/containers/fl-a-0/busy"), Ok(Route::Busy("fl-a-0".into())));
        for (m, p) in [
            ("PUT", "/fleet/v1/containers/fl-a-0/busy"),
            ("GET", "/v1.41/fleet/v1/containers/fl-a-0/busy"),
            ("GET", "/fleet/v1/containers/busy"),
            ("POST", "/v1.41/containers/abc/exec"),
            ("POST", "/exec/abc/start"),
            ("PUT", "/v1.41/containers/abc/archive"),
            ("GET", "/v1.41/containers/abc/archive"),
            ("GET", "/v1.41/containers/abc/export"),
            ("POST", "/v1.41/containers/abc/kill"),
            ("POST", "/v1.41/containers/abc/restart"),
            ("POST", "/v1.41/images/create"),
            ("POST", "/v1.41/networks/create"),
            ("POST", "/v1.41/build"),
            ("DELETE", "/v1.41/volumes/fl-x"),
            ("GET", "/v1.41/info"),
            ("GET", "/vx/containers/json"),
        ] {
            let e = r(m, p).expect_err(p).0;
            assert!(e.ends_with("is not an endpoint fleet-node uses"), "{e}");
        }
    }

    #[test]
    fn a_path_not_in_its_plain_form_is_refused_before_routing() {
        for p in [
            "//containers/create",
            "/v1.41//containers/create",
            "/containers/create/",
            "/containers/./create",
            "/v1.41/containers/..%2Fimages%2Fcreate/start",
            "/containers/%61bc/start",
            "containers/create",
        ] {
            let e = r("POST", p).expect_err(p).0;
            assert!(e.contains("plain form") || e.contains("not absolute"), "{p}: {e}");
        }
    }

    #[test]
    fn versions_before_1_40_are_refused() {
        for p in ["/v1.23/containers/abc/start", "/v1.39/containers/create", "/v0.99/_ping"] {
            let e = r("POST", p).unwrap_err().0;
            assert!(e.contains("versions below v1.40 accept a HostConfig"), "{p}: {e}");
        }
        assert!(r("POST", "/v1..2/containers/create").unwrap_err().0.contains("is not a version"));
        assert!(r("POST", "/v1.41.1/containers/create").unwrap_err().0.contains("is not a version"));
        assert_eq!(r("POST", "/v1.40/containers/abc/start"), container("abc", Action::Start));
        assert_eq!(r("POST", "/v2.1/containers/create"), Ok(Route::CreateContainer));
    }

    #[test]
    fn each_route_reads_its_own_query_and_the_guard_builds_the_path_forwarded() {
        let stop = route("POST", "/v1.41/containers/fl-a-0/stop", Some("t=30")).unwrap();
        assert_eq!(stop.forward_path(&"f".repeat(64)), format!("/v1.41/containers/{}/stop?t=30", "f".repeat(64)));
        let e = route("POST", "/v1.41/containers/fl-a-0/start", Some("checkpoint=c1&checkpoint-dir=/x")).unwrap_err();
        assert!(e.0.contains("\"checkpoint\" is not allowed here (this call takes no query)"), "{}", e.0);
        assert!(route("DELETE", "/containers/fl-a-0", Some("link=1")).is_err());
        assert!(
            route("DELETE", "/containers/fl-a-0", Some("v=false&force=true&link=false")).is_ok(),
            "what bollard sends"
        );
        assert!(route("GET", "/_ping", Some("x=1")).is_err());
        let create = route("POST", "/containers/create", Some("name=fl-a-0")).unwrap();
        assert_eq!(create.forward_path(""), "/containers/create?name=fl-a-0");
        assert_eq!(create.query.get("name"), Some("fl-a-0"));
    }

    #[test]
    fn only_creates_take_a_body() {
        assert!(Route::CreateContainer.takes_body() && Route::CreateVolume.takes_body());
        assert!(!Route::Container("a".into(), Action::Start).takes_body() && !Route::ListContainers.takes_body());
    }
}
