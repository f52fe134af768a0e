//! Plain HTTP only where nothing can listen in (docs/behaviour.md#hardening): `http://` URLs are accepted for
//! loopback hosts (`localhost`, `127.0.0.0/8`, `[::1]`) and refused elsewhere unless the
//! operator says otherwise (`insecure: true` in node.yaml, `FLEET_ALLOW_INSECURE_HTTP=true`
//! for the controller). A JWKS fetched in clear would let anyone on the path mint admin tokens.

/// The host of an `http://` or `https://` URL, without port or brackets.
pub fn host(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = hostport.strip_prefix('[') {
        return v6.split_once(']').map(|(h, _)| h);
    }
    Some(hostport.split(':').next().unwrap_or(hostport))
}

pub fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") || host == "::1" {
        return true;
    }
    host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether `url` is plain HTTP to a host other than this machine.
pub fn is_insecure(url: &str) -> bool {
    url.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("http://")) && !host(url).is_some_and(is_loopback_host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_insecure_except_to_loopback() {
        for ok in [
            "https://platform.example.com/fleet",
            "http://127.0.0.1:8040",
            "http://127.9.9.9/x",
            "http://localhost:8040/fleet",
            "http://[::1]:8040",
            "http://user:pw@127.0.0.1/",
        ] {
            assert!(!is_insecure(ok), "{ok}");
        }
        for bad in [
            "http://platform.example.com/fleet",
            "http://10.0.0.5:8040",
            "http://127.0.0.1.evil.example/",
            "http://localhost.evil.example",
            "HTTP://iam.example.com",
            "http://127.0.0.1@evil.example/",
        ] {
            assert!(is_insecure(bad), "{bad}");
        }
        assert_eq!(host("https://a.example:443/x?y"), Some("a.example"));
    }
}
