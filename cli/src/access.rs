//! Where fleetctl's token comes from and where it may be sent (docs/reference.md#fleetctl):
//! `FLEET_TOKEN` or `--token-file`; `--token` works but warns, since any user on the machine
//! sees a command line in `ps`; and a token goes over plain `http://` only to this machine,
//! unless `--insecure` says the admin means it.

use std::net::IpAddr;
use std::path::Path;

/// The token from `--token-file`, `--token` or `FLEET_TOKEN` (in that order), and the warning to
/// print when it came from the command line.
pub fn token(
    flag: Option<&str>,
    file: Option<&Path>,
    env: Option<String>,
) -> Result<(Option<String>, Option<String>), String> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| format!("--token-file {}: {e}", path.display()))?;
        let t = text.trim();
        if t.is_empty() {
            return Err(format!("--token-file {} is empty", path.display()));
        }
        return Ok((Some(t.to_string()), None));
    }
    if let Some(t) = flag {
        let warning = "warning: --token puts the token on the command line, where other users see it (ps); \
                       use FLEET_TOKEN or --token-file";
        return Ok((Some(t.to_string()), Some(warning.to_string())));
    }
    Ok((env.filter(|t| !t.is_empty()), None))
}

/// Refuses to send a token over `http://` to a host other than this machine without `insecure`.
pub fn check_transport(url: &str, has_token: bool, insecure: bool) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("--url {url:?} is not a URL: {e}"))?;
    if parsed.scheme() != "http" || !has_token || insecure {
        return Ok(());
    }
    let host = parsed.host_str().unwrap_or("");
    let ip = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>();
    let loopback = host.eq_ignore_ascii_case("localhost") || ip.is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return Ok(());
    }
    Err(format!(
        "refusing to send the token over plain http:// to {}: anyone on the path could read it; \
         use https://, or pass --insecure to send it anyway",
        parsed.host_str().unwrap_or("?")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_over_http_only_to_this_machine() {
        for url in ["http://127.0.0.1:8040", "http://localhost:8040", "http://[::1]:8040", "https://fleet.example.com"]
        {
            assert_eq!(check_transport(url, true, false), Ok(()), "{url}");
        }
        let e = check_transport("http://fleet.example.com", true, false).unwrap_err();
        assert!(e.starts_with("refusing to send the token over plain http:// to fleet.example.com"), "{e}");
        assert!(check_transport("http://10.0.0.5:8040", true, false).is_err());
        assert_eq!(check_transport("http://fleet.example.com", true, true), Ok(()), "--insecure");
        assert_eq!(check_transport("http://fleet.example.com", false, false), Ok(()), "no token to leak");
        assert!(check_transport("not a url", true, false).is_err());
    }

    #[test]
    fn the_token_file_wins_and_the_command_line_warns() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
        std::fs::write(&f, "tok-file\n").unwrap();
        assert_eq!(token(Some("tok-flag"), Some(&f), Some("tok-env".into())).unwrap(), (Some("tok-file".into()), None));
        let (t, warning) = token(Some("tok-flag"), None, Some("tok-env".into())).unwrap();
        assert_eq!(t.as_deref(), Some("tok-flag"));
        assert!(warning.unwrap().contains("use FLEET_TOKEN or --token-file"));
        assert_eq!(token(None, None, Some("tok-env".into())).unwrap(), (Some("tok-env".into()), None));
        assert_eq!(token(None, None, None).unwrap(), (None, None));
        std::fs::write(&f, "  \n").unwrap();
        assert!(token(None, Some(&f), None).unwrap_err().ends_with("is empty"));
        assert!(token(None, Some(&dir.path().join("missing")), None).unwrap_err().starts_with("--token-file"));
    }
}
