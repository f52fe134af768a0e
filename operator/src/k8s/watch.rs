//! The mirror's watches (docs/behaviour.md#kubernetes-mirror): one per kind, on this fleet's
//! objects only (both labels), reduced to what the belief needs and what went wrong. kube's
//! watcher relists by itself after an error, with the backoff below; a `410 Expired` (the
//! server's history moved past the watch, as after an API-server restart) is its normal path,
//! not a fault.

use super::belief::Seen;
use super::crd::{FLEET_LABEL, MANAGED_BY};
use super::kind::Kind;
use futures::{Stream, StreamExt};
use kube::api::{Api, DynamicObject};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use std::time::Duration;

/// What a watch reports.
#[derive(Debug)]
pub enum Watched {
    Seen(Seen),
    /// `410 Expired`: a relist follows.
    Expired,
    /// The cluster refused the watch (403 forbidden, 404: the CRD is gone).
    Refused(String),
    /// The server did not answer.
    Unanswered(String),
}

/// The label selector of this fleet's mirrors.
pub fn selector(fleet_id: &str) -> String {
    format!("{}={},{FLEET_LABEL}={fleet_id}", MANAGED_BY.0, MANAGED_BY.1)
}

/// The watch of one kind's mirrors of this fleet in `namespace`.
pub fn events(
    client: Client,
    namespace: &str,
    fleet_id: &str,
    kind: Kind,
) -> impl Stream<Item = (Kind, Watched)> + Send {
    let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &kind.resource());
    let cfg = watcher::Config::default().labels(&selector(fleet_id));
    watcher(api, cfg).backoff(Retry::default()).map(move |ev| (kind, reduce(ev)))
}

fn reduce(ev: Result<watcher::Event<DynamicObject>, watcher::Error>) -> Watched {
    match ev {
        Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => Watched::Seen(Seen::Applied(Box::new(o))),
        Ok(watcher::Event::Delete(o)) => Watched::Seen(Seen::Deleted(o.metadata.name.unwrap_or_default())),
        Ok(watcher::Event::Init) => Watched::Seen(Seen::Relist),
        Ok(watcher::Event::InitDone) => Watched::Seen(Seen::RelistDone),
        Err(watcher::Error::WatchError(s)) if s.code == 410 => Watched::Expired,
        Err(e) => classify(e),
    }
}

fn classify(e: watcher::Error) -> Watched {
    let inner = match &e {
        watcher::Error::InitialListFailed(k) | watcher::Error::WatchStartFailed(k) | watcher::Error::WatchFailed(k) => {
            Some(k)
        }
        _ => None,
    };
    match inner {
        Some(kube::Error::Api(s)) if s.code == 410 => Watched::Expired,
        Some(k) if super::check::is_answer(k) => Watched::Refused(e.to_string()),
        _ => match &e {
            watcher::Error::WatchError(s) if s.code != 429 && (400..500).contains(&s.code) => {
                Watched::Refused(e.to_string())
            }
            _ => Watched::Unanswered(e.to_string()),
        },
    }
}

/// The watches' retry delay: 0.5 s doubling to 8 s, back to 0.5 s after an event. Short at the
/// top, so the mirror catches up within seconds of an API server's return; two watches at
/// that pace are no load.
pub struct Retry {
    next: Duration,
}

const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(8);

impl Default for Retry {
    fn default() -> Self {
        Retry { next: RETRY_MIN }
    }
}

impl Iterator for Retry {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(RETRY_MAX);
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for Retry {
    fn reset(&mut self) {
        self.next = RETRY_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_410_is_a_relist_and_a_403_a_refusal() {
        let status = |code: u16| kube::core::Status { code, message: format!("code {code}"), ..Default::default() };
        let expired = watcher::Error::WatchError(Box::new(status(410)));
        assert!(matches!(reduce(Err(expired)), Watched::Expired));
        let forbidden = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status(403))));
        assert!(matches!(reduce(Err(forbidden)), Watched::Refused(_)));
        let down = watcher::Error::WatchFailed(kube::Error::Api(Box::new(status(503))));
        assert!(matches!(reduce(Err(down)), Watched::Unanswered(_)));
        let mut r = Retry::default();
        let delays: Vec<_> = (&mut r).take(6).map(|d| d.as_millis()).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 8000]);
        kube::runtime::utils::Backoff::reset(&mut r);
        assert_eq!(r.next(), Some(RETRY_MIN));
    }

    #[test]
    fn the_selector_names_both_labels() {
        assert_eq!(selector("f1"), "app.kubernetes.io/managed-by=fleet-controller,fleet.taimen.dev/fleet=f1");
    }
}
