//! Plain HTTP only where nothing can listen in (docs/behaviour.md#hardening): `http://` URLs are accepted for
//! loopback hosts (`localhost`, `127.0.0.0/8`, `[::1]`) and refused elsewhere unless the
//! operator says otherwise (`insecure: true` in node.yaml, `FLEET_ALLOW_INSECURE_HTTP=true`
//! for the controller). A JWKS fetched in clear would let anyone on the path mint admin tokens.
//! URLs are read with the library the HTTP clients read them with (`url`, under reqwest): a
//! hand-made reader would find another host in `http://elsewhere\@127.0.0.1/` than the client
//! connects to. And a redirect may not lead elsewhere: a client follows one only to the same
//! scheme, host and port ([`same_origin`]).

pub use url::Url;

/// The host of an `http://` or `https://` URL, without port or brackets, as the client reads it.
pub fn host(url: &str) -> Option<String> {
    let u = Url::parse(url).ok()?;
    let host = match u.host()? {
        url::Host::Ipv6(ip) => ip.to_string(),
        other => other.to_string(),
    };
    Some(host)
}

pub fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") || host == "::1" {
        return true;
    }
    host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether `url` is plain HTTP to a host other than this machine (or not a URL at all).
pub fn is_insecure(url: &str) -> bool {
    match Url::parse(url) {
        Ok(u) => u.scheme() == "http" && !host(url).is_some_and(|h| is_loopback_host(&h)),
        Err(_) => true,
    }
}

/// Whether a redirect from `from` to `to` stays where the client was told to go: the same
/// scheme, host and port. Any other is refused — a `307` re-posts the body (a client secret, a
/// join key) to wherever it points.
pub fn same_origin(from: &Url, to: &Url) -> bool {
    from.scheme() == to.scheme()
        && from.host() == to.host()
        && from.port_or_known_default() == to.port_or_known_default()
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
            // The client reads `\` as `/`: its host is `elsewhere`, whatever follows the `@`.
            "http://elsewhere\\@127.0.0.1/jwks",
            "not a url",
        ] {
            assert!(is_insecure(bad), "{bad}");
        }
        assert_eq!(host("https://a.example:443/x?y").as_deref(), Some("a.example"));
        assert_eq!(host("http://elsewhere\\@127.0.0.1/").as_deref(), Some("elsewhere"));
    }

    #[test]
    fn a_redirect_keeps_scheme_host_and_port() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert!(same_origin(&u("http://127.0.0.1:8041/a"), &u("http://127.0.0.1:8041/b?c")));
        assert!(same_origin(&u("https://iam.example/a"), &u("https://iam.example:443/b")));
        for other in
            ["http://evil.example:8041/", "https://127.0.0.1:8041/", "http://127.0.0.1:8042/", "http://localhost:8041/"]
        {
            assert!(!same_origin(&u("http://127.0.0.1:8041/a"), &u(other)), "{other}");
        }
    }
}
