//! The link to the controller (docs/behaviour.md#the-nodes-loops): gets the desired state, saves it to
//! `desired.json` and hands it to the converge loop, and reports what the node has at least
//! every `observeSeconds` — over one exchange request while the controller offers it, else as
//! the pull and report loops over the two routes of docs/behaviour.md#desired-state-and-observed-report. Failures back off and try again;
//! only a rejected credential ends the link (and the process). A controller whose store does
//! not know the node (`node_unknown`, docs/behaviour.md#a-store-older-than-the-fleet) is asked
//! again each minute while the agents keep running on the last desired state.

use super::announce::Reporter;
use super::desired::{parse_desired, DesiredTx};
use super::fatal::{Fatal, CREDENTIAL_REJECTED, NODE_UNKNOWN};
use crate::client::{retry_delay, Client, ClientError, Offer};
use crate::config::NodeConfig;
use crate::state::{Identity, StateDir};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How often a node the controller does not know asks again: its store may come back (a
/// newer backup restored), or the node be joined again.
pub(super) const UNKNOWN_RETRY: Duration = Duration::from_secs(60);
/// How often it says so in its log while it lasts.
const UNKNOWN_SAID_EVERY: Duration = Duration::from_secs(600);

/// A loop's record of saying that the controller does not know this node.
#[derive(Default)]
struct Unknown {
    said: Option<Instant>,
}

impl Unknown {
    /// Says it (the controller's message with the node's own), at most every ten minutes.
    fn say(&mut self, message: &str) {
        if self.said.is_none_or(|t| t.elapsed() >= UNKNOWN_SAID_EVERY) {
            tracing::error!(controller = %message, "{NODE_UNKNOWN}");
            self.said = Some(Instant::now());
        }
    }
}

/// The node's side of the conversation with the controller (docs/behaviour.md#the-nodes-loops): the exchange while
/// the controller offers it — one request that reports and long-polls, so one connection —
/// else the two loops over the two routes of docs/behaviour.md#desired-state-and-observed-report (an older controller).
pub(super) struct Link {
    cfg: Arc<NodeConfig>,
    client: Client,
    identity: Arc<Identity>,
    state: StateDir,
    reporter: Reporter,
}

/// Why the exchange stopped.
enum Stopped {
    /// The process must end (the loop has sent the reason).
    Fatal,
    /// Back to the two routes for good.
    Declined,
}

impl Link {
    pub(super) fn new(
        cfg: Arc<NodeConfig>,
        client: Client,
        identity: Arc<Identity>,
        state: StateDir,
        reporter: Reporter,
    ) -> Link {
        Link { cfg, client, identity, state, reporter }
    }

    pub(super) async fn run(self, tx: DesiredTx, fatal: mpsc::Sender<Fatal>) {
        // Let the supervisor look at Docker once before the first report.
        tokio::time::sleep(Duration::from_millis(300)).await;
        loop {
            if self.client.offer() == Offer::Offered {
                match self.exchange_loop(&tx, &fatal).await {
                    Stopped::Fatal => return,
                    Stopped::Declined => self.client.decline(),
                }
            }
            let two_routes = async {
                tokio::select! {
                    () = self.pull_loop(&tx, &fatal) => {}
                    () = self.report_loop(&fatal) => {}
                }
            };
            tokio::select! {
                // Either loop ends only to stop the process.
                () = two_routes => return,
                () = self.client.offered(), if self.client.offer() == Offer::Unknown => {}
            }
        }
    }

    fn since(tx: &DesiredTx) -> Option<u64> {
        tx.borrow().as_ref().map(|d| d.generation)
    }

    /// Saves and hands on a new desired state; `false` when it cannot be read.
    fn take_desired(&self, tx: &DesiredTx, bytes: &[u8]) -> bool {
        match parse_desired(bytes) {
            Ok(d) => {
                if let Err(e) = self.state.save_desired(bytes) {
                    tracing::error!(error = %e, "cannot save desired.json");
                }
                tracing::info!(generation = d.generation, agents = d.agents.len(), "new desired state");
                let _ = tx.send(Some(Arc::new(d)));
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "the controller sent a desired state this node cannot read");
                false
            }
        }
    }

    /// Takes a new desired state (the backoff starts again), or waits out the backoff when
    /// it cannot be read.
    async fn take_or_back_off(&self, tx: &DesiredTx, bytes: &[u8], attempt: &mut u32) {
        if self.take_desired(tx, bytes) {
            *attempt = 0;
        } else {
            tokio::time::sleep(retry_delay(*attempt)).await;
            *attempt += 1;
        }
    }

    /// Report and long-poll in one request, `wait` = the report period (at most 60 s): the
    /// node reports at least every period and hears of a new desired state at once.
    async fn exchange_loop(&self, tx: &DesiredTx, fatal: &mpsc::Sender<Fatal>) -> Stopped {
        tracing::info!("the controller offers the exchange: reports and the desired state share one connection");
        let wait = u64::from(self.cfg.observe_seconds).min(60);
        let (mut attempt, mut unknown) = (0, Unknown::default());
        loop {
            let report = self.reporter.next();
            let answer = tokio::select! {
                answer = self.client.exchange(&self.identity.token, Self::since(tx), wait, &report) => answer,
                // A replica went busy or idle: this exchange is given up for one with the news.
                () = self.reporter.due_early() => continue,
            };
            match answer {
                Ok(Some(bytes)) => self.take_or_back_off(tx, &bytes, &mut attempt).await,
                Ok(None) => attempt = 0,
                Err(ClientError::Unknown(m)) => {
                    unknown.say(&m);
                    tokio::time::sleep(UNKNOWN_RETRY).await;
                }
                Err(ClientError::Unauthorized(_)) => {
                    let _ = fatal.send(Fatal(CREDENTIAL_REJECTED.into())).await;
                    return Stopped::Fatal;
                }
                // The desired state must keep coming while the report is refused: the two
                // routes carry it, and log the refusal every period as before.
                Err(ClientError::BadRequest(m)) => {
                    tracing::error!(message = %m, "the controller refused the report (upgrade the controller before the nodes); using the two-route protocol");
                    return Stopped::Declined;
                }
                Err(ClientError::Other(code @ (404 | 405), _)) => {
                    tracing::warn!(code, "the controller does not serve the exchange; using the two-route protocol");
                    return Stopped::Declined;
                }
                Err(e) => {
                    let d = retry_delay(attempt);
                    tracing::warn!(error = %e, retry_in = ?d, "exchange with the controller failed");
                    tokio::time::sleep(d).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Two-route protocol: long-poll `desired?since=&wait=60`; returns only to stop the process.
    async fn pull_loop(&self, tx: &DesiredTx, fatal: &mpsc::Sender<Fatal>) {
        let (mut attempt, mut unknown) = (0, Unknown::default());
        loop {
            match self.client.desired(&self.identity.token, Self::since(tx), 60).await {
                Ok(Some(bytes)) => self.take_or_back_off(tx, &bytes, &mut attempt).await,
                Ok(None) => attempt = 0,
                Err(ClientError::Unknown(m)) => {
                    unknown.say(&m);
                    tokio::time::sleep(UNKNOWN_RETRY).await;
                }
                Err(ClientError::Unauthorized(_)) => {
                    let _ = fatal.send(Fatal(CREDENTIAL_REJECTED.into())).await;
                    return;
                }
                Err(e) => {
                    let d = retry_delay(attempt);
                    tracing::warn!(error = %e, retry_in = ?d, "desired-state poll failed");
                    tokio::time::sleep(d).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Two-route protocol: `PUT observed` every `observeSeconds`; returns only to stop the
    /// process.
    async fn report_loop(&self, fatal: &mpsc::Sender<Fatal>) {
        let mut tick = tokio::time::interval(Duration::from_secs(u64::from(self.cfg.observe_seconds)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut unknown = Unknown::default();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.reporter.due_early() => {}
            }
            match self.client.observed(&self.identity.token, &self.reporter.next()).await {
                Ok(()) => {}
                Err(ClientError::Unknown(m)) => unknown.say(&m),
                Err(ClientError::Unauthorized(_)) => {
                    let _ = fatal.send(Fatal(CREDENTIAL_REJECTED.into())).await;
                    return;
                }
                Err(ClientError::BadRequest(m)) => {
                    tracing::error!(message = %m, "the controller refused the report (upgrade the controller before the nodes)")
                }
                Err(e) => tracing::warn!(error = %e, "report failed; the next period tries again"),
            }
        }
    }
}

#[cfg(test)]
mod tests;
