//! Which Docker API calls the guard admits (docs/behaviour.md#packaging-and-the-docker-guard):
//! the routes fleet-node uses and nothing else, at an API version of 1.40 or later (older
//! versions take a `HostConfig` in the start body, past the create check).

/// A refused request: the rule, as the 403 body's `message` says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

pub fn refuse<T>(rule: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(rule.into()))
}

/// The oldest API version admitted in a path.
const OLDEST: (u32, u32) = (1, 40);

/// What an admitted request is, for the proxy to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/_ping`, `/version`: forwarded as is.
    Plain,
    /// `GET /containers/json`: the answer is cut to this node's containers.
    ListContainers,
    /// `GET /volumes`: the answer is cut to this node's volumes.
    ListVolumes,
    /// `POST /containers/create`: the body is checked and re-serialised.
    CreateContainer,
    /// `POST /volumes/create`: the body is checked and re-serialised.
    CreateVolume,
    /// Start, stop, inspect or remove one container: only one of this node's.
    Container(String),
    /// `GET /images/{name}/json`: whether an image is present (`checkBeforeStop`); read-only.
    InspectImage,
}

impl Route {
    /// Whether a request body is part of the call (elsewhere one is refused).
    pub fn takes_body(&self) -> bool {
        matches!(self, Route::CreateContainer | Route::CreateVolume)
    }
}

/// The routes fleet-node uses, with or without a `/v1.NN` version prefix.
pub fn route(method: &str, path: &str) -> Result<Route, Refusal> {
    let path = strip_version(path)?;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let route = match (method, parts.as_slice()) {
        ("GET" | "HEAD", ["_ping"]) | ("GET", ["version"]) => Route::Plain,
        ("GET", ["containers", "json"]) => Route::ListContainers,
        ("GET", ["volumes"]) => Route::ListVolumes,
        ("POST", ["containers", "create"]) => Route::CreateContainer,
        ("POST", ["volumes", "create"]) => Route::CreateVolume,
        ("GET", ["containers", id, "json"])
        | ("POST", ["containers", id, "start" | "stop"])
        | ("DELETE", ["containers", id])
            if is_container_ref(id) =>
        {
            Route::Container(id.to_string())
        }
        ("GET", ["images", name @ .., "json"]) if is_image_ref(&name.join("/")) => Route::InspectImage,
        _ => return refuse(format!("{method} {path} is not an endpoint fleet-node uses")),
    };
    Ok(route)
}

/// A container id or name as the node uses them: no encoded separators reach the engine.
pub fn is_container_ref(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// An image reference as node.yaml names them: no encoded separators, no `..`.
fn is_image_ref(name: &str) -> bool {
    !name.is_empty()
        && !name.contains("..")
        && !name.split('/').any(str::is_empty)
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':' | '/' | '@'))
}

/// The path without its `/vX.Y` prefix; a version below [`OLDEST`] is refused.
fn strip_version(path: &str) -> Result<&str, Refusal> {
    let Some(rest) = path.strip_prefix("/v") else { return Ok(path) };
    let (version, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if version.is_empty() || !version.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Ok(path);
    }
    let mut parts = version.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= OLDEST => Ok(tail),
        (Some(Ok(_)), Some(Ok(_))) => refuse(format!(
            "API version v{version} is refused: versions below v1.40 accept a HostConfig when a container starts"
        )),
        _ => refuse(format!("API version v{version} is not a version")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_endpoints_fleet_node_uses_are_routed() {
        assert_eq!(route("GET", "/_ping"), Ok(Route::Plain));
        assert_eq!(route("HEAD", "/v1.41/_ping"), Ok(Route::Plain));
        assert_eq!(route("GET", "/v1.47/version"), Ok(Route::Plain));
        assert_eq!(route("GET", "/v1.47/images/registry.example.com/agent-runner:1.5/json"), Ok(Route::InspectImage));
        assert!(route("GET", "/images/../containers/json").is_err());
        assert!(route("POST", "/images/a:1/json").is_err());
        assert!(route("DELETE", "/images/a:1").is_err());
        assert_eq!(route("GET", "/v1.41/containers/json"), Ok(Route::ListContainers));
        assert_eq!(route("GET", "/v1.41/volumes"), Ok(Route::ListVolumes));
        assert_eq!(route("POST", "/v1.41/containers/create"), Ok(Route::CreateContainer));
        assert_eq!(route("POST", "/volumes/create"), Ok(Route::CreateVolume));
        for (m, p) in [
            ("GET", "/containers/abc/json"),
            ("POST", "/containers/abc/start"),
            ("POST", "/containers/abc/stop"),
            ("DELETE", "/containers/abc"),
        ] {
            assert_eq!(route(m, &format!("/v1.41{p}")), Ok(Route::Container("abc".into())), "{m} {p}");
        }
        for (m, p) in [
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
            ("POST", "/v1.41/containers/..%2Fimages%2Fcreate/start"),
            ("GET", "/vx/containers/json"),
        ] {
            let e = route(m, p).expect_err(p).0;
            assert!(e.ends_with("is not an endpoint fleet-node uses"), "{e}");
        }
    }

    #[test]
    fn versions_before_1_40_are_refused() {
        for p in ["/v1.23/containers/abc/start", "/v1.39/containers/create", "/v0.99/_ping"] {
            let e = route("POST", p).unwrap_err().0;
            assert!(e.contains("versions below v1.40 accept a HostConfig"), "{p}: {e}");
        }
        assert!(route("POST", "/v1..2/containers/create").unwrap_err().0.contains("is not a version"));
        assert_eq!(route("POST", "/v1.40/containers/abc/start"), Ok(Route::Container("abc".into())));
        assert_eq!(route("POST", "/v2.1/containers/create"), Ok(Route::CreateContainer));
    }

    #[test]
    fn only_creates_take_a_body() {
        assert!(Route::CreateContainer.takes_body() && Route::CreateVolume.takes_body());
        assert!(!Route::Container("a".into()).takes_body() && !Route::ListContainers.takes_body());
    }
}
