//! A node's claims against its allowance (docs/behaviour.md#what-a-node-may-claim): what it
//! reports is split once per report into the effective facts, which [`NodeInfo`] holds where
//! placement reads them, and the refused rest, kept aside so that a changed allowance is
//! applied at once, without waiting for the node's next report.

use super::event::{Event, Kind};
use super::node::{sorted, NodeInfo, NodeRec};
use fleet_api::claims::{self, Allowance, Claimed, RefusedFacts};
use std::collections::BTreeMap;

/// What a join or a report claims, normalised: lists sorted and each entry once, image lists
/// only of announced kinds and not empty, each kind's secrets only those the node announces
/// (`secrets`, sorted).
pub fn claimed_of(
    labels: &[String],
    kinds: &[String],
    images: &BTreeMap<String, Vec<String>>,
    secrets_by_kind: &BTreeMap<String, Vec<String>>,
    secrets: &[String],
) -> Claimed {
    let announced = |k: &String| kinds.contains(k);
    Claimed {
        labels: sorted(labels),
        kinds: sorted(kinds),
        images: images
            .iter()
            .filter(|(k, v)| announced(k) && !v.is_empty())
            .map(|(k, v)| (k.clone(), sorted(v)))
            .collect(),
        secrets: secrets_by_kind
            .iter()
            .filter(|(k, _)| announced(k))
            .map(|(k, v)| (k.clone(), sorted(v).into_iter().filter(|s| secrets.binary_search(s).is_ok()).collect()))
            .collect(),
    }
}

impl NodeInfo {
    /// Takes what a node claims: what `allowance` admits becomes the effective facts, the rest
    /// is kept in `refused`. Without an allowance everything is admitted and nothing is split.
    pub fn admit(&mut self, claimed: Claimed, allowance: Option<&Allowance>) {
        let (kept, refused) = match allowance {
            Some(a) if !a.is_open() => claims::split(claimed, a),
            _ => (claimed, Claimed::default()),
        };
        self.labels = kept.labels;
        self.executor_kinds = kept.kinds;
        self.executor_images = kept.images;
        self.executor_secrets = (!kept.secrets.is_empty()).then(|| Box::new(kept.secrets));
        self.refused = (!refused.is_empty()).then(|| Box::new(refused));
    }

    /// Everything the node claimed, effective and refused together.
    pub fn claimed(&self) -> Claimed {
        let kept = Claimed {
            labels: self.labels.clone(),
            kinds: self.executor_kinds.clone(),
            images: self.executor_images.clone(),
            secrets: self.executor_secrets.as_deref().cloned().unwrap_or_default(),
        };
        match &self.refused {
            Some(r) => claims::merge(kept, (**r).clone()),
            None => kept,
        }
    }

    /// The labels and kinds refused, as the node view lists them.
    pub fn refused_facts(&self) -> RefusedFacts {
        match &self.refused {
            Some(r) => RefusedFacts { labels: r.labels.clone(), kinds: r.kinds.clone() },
            None => RefusedFacts::default(),
        }
    }

    /// The secrets this node offers an agent of `kind`: its kind's own list when it has one,
    /// else every secret it announces (docs/behaviour.md#secrets).
    pub fn secrets_for(&self, kind: &str) -> &[String] {
        self.executor_secrets.as_ref().and_then(|m| m.get(kind)).unwrap_or(&self.secrets)
    }
}

/// Whether the refused labels or kinds differ: what a `node_facts_refused` event is about.
pub fn refused_changed(before: &NodeInfo, after: &NodeInfo) -> bool {
    fn facts(i: &NodeInfo) -> Option<(&Vec<String>, &Vec<String>)> {
        i.refused.as_ref().map(|r| (&r.labels, &r.kinds))
    }
    facts(before) != facts(after)
}

impl NodeRec {
    /// Splits the node's claims again under its current allowance (after a change of it, or
    /// a stored row written under another).
    pub fn readmit(&mut self) {
        let mut info = std::mem::take(&mut self.info);
        if self.allowed.is_none() && info.refused.is_none() {
            // Nothing refused and nothing to refuse (most nodes, read back at a start).
            return self.set_info(info);
        }
        let claimed = info.claimed();
        info.admit(claimed, self.allowed.as_deref());
        self.set_info(info);
    }
}

/// The allowance as stored: `None` (a NULL column) for one that allows anything.
pub fn allowance_column(allowed: &Allowance) -> Option<String> {
    (!allowed.is_open()).then(|| serde_json::to_string(allowed).unwrap_or_default())
}

/// A stored allowance; `None` for none. One that no longer parses (a stored row is this
/// controller's own writing, so that is a bug) allows nothing, logged, until an admin sets it
/// again: a node whose limits are unknown must not attract agents.
pub fn allowance_of(column: Option<&str>) -> Option<Box<Allowance>> {
    let text = column?;
    match serde_json::from_str::<Allowance>(text) {
        Ok(a) if a.is_open() => None,
        Ok(a) => Some(Box::new(a.normalised())),
        Err(e) => {
            tracing::error!(error = %e, "a stored allowance does not parse; the node may claim nothing until it is set again");
            Some(Box::new(Allowance { allowed_labels: Some(vec![]), allowed_kinds: Some(vec![]) }))
        }
    }
}

/// `node_facts_refused`, naming what the node claimed and may not (docs/behaviour.md#events).
pub fn refused_event(refused: &fleet_api::claims::RefusedFacts) -> Event {
    let msg = format!("refused {} (not allowed by the node's allowance)", refused.describe());
    Event::new(Kind::NodeFactsRefused, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_changed_allowance_applies_to_what_the_node_last_claimed() {
        let mut n = NodeRec::bare("n", "n");
        n.allowed = Some(Box::new(Allowance { allowed_labels: Some(strings(&["zone=*"])), allowed_kinds: None }));
        let mut info = NodeInfo::default();
        info.admit(
            Claimed { labels: strings(&["gpu", "zone=eu"]), kinds: strings(&["k"]), ..Default::default() },
            n.allowed.as_deref(),
        );
        n.set_info(info);
        assert_eq!(n.info.labels, strings(&["zone=eu"]));
        assert_eq!(n.info.refused_facts().labels, strings(&["gpu"]));

        n.allowed =
            Some(Box::new(Allowance { allowed_labels: Some(strings(&["gpu", "zone=*"])), allowed_kinds: None }));
        n.readmit();
        assert_eq!(n.info.labels, strings(&["gpu", "zone=eu"]));
        assert!(n.info.refused.is_none() && n.info.refused_facts().is_empty());

        n.allowed = Some(Box::new(Allowance { allowed_labels: None, allowed_kinds: Some(vec![]) }));
        n.readmit();
        assert!(n.info.executor_kinds.is_empty(), "an empty list allows no kind");
        assert_eq!(n.info.refused_facts().kinds, strings(&["k"]));
        assert_eq!(n.info.labels, strings(&["gpu", "zone=eu"]));
    }

    #[test]
    fn a_stored_allowance_that_does_not_parse_allows_nothing() {
        assert_eq!(allowance_of(None), None);
        assert_eq!(allowance_of(Some("{}")), None, "an open allowance is none");
        let closed = allowance_of(Some("{not json")).unwrap();
        assert!(!closed.label_allowed("zone=eu") && !closed.kind_allowed("k"));
    }

    #[test]
    fn a_kind_without_its_own_list_is_offered_every_secret() {
        let info = NodeInfo {
            secrets: strings(&["gh", "mail"]),
            executor_secrets: Some(Box::new([("observer".to_string(), strings(&["mail"]))].into())),
            ..Default::default()
        };
        assert_eq!(info.secrets_for("observer"), strings(&["mail"]).as_slice());
        assert_eq!(info.secrets_for("claude-code"), strings(&["gh", "mail"]).as_slice());
    }
}
