//! The registry's (agent, node) pairs, grouped by node: a node's pairs are one vector sorted
//! by agent key, exactly as long as it is. A node has about as many pairs as it has slots,
//! so a lookup is a hash of the node id and a binary search over a dozen keys.
//!
//! Keyed by the pair, the table would be one hash slot of 48 bytes a pair at 44–87 % load —
//! 6.4 MB at 100,000 pairs, with the old table held beside the new one while it doubles; and
//! pairs are kept after a move (their PAT counter), so every recovery adds its moved
//! replicas. Grouped by node it is 32 bytes a pair and one slot a node.

use crate::model::Id;
use crate::store::records::PairRec;
use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct Pairs {
    by_node: HashMap<Id, Vec<(Id, PairRec)>>,
}

fn find(v: &[(Id, PairRec)], agent: &str) -> Result<usize, usize> {
    v.binary_search_by(|(a, _)| (**a).cmp(agent))
}

impl Pairs {
    pub fn get(&self, agent: &str, node: &str) -> Option<&PairRec> {
        let v = self.by_node.get(node)?;
        find(v, agent).ok().map(|i| &v[i].1)
    }

    pub fn get_mut(&mut self, agent: &str, node: &str) -> Option<&mut PairRec> {
        let v = self.by_node.get_mut(node)?;
        find(v, agent).ok().map(|i| &mut v[i].1)
    }

    /// The pair's record, made (empty) if it has none.
    pub fn entry(&mut self, agent: &Id, node: &Id) -> &mut PairRec {
        if !self.by_node.contains_key(node) {
            self.by_node.insert(node.clone(), Vec::new());
        }
        let v = self.by_node.get_mut(node).expect("inserted above");
        let i = match find(v, agent) {
            Ok(i) => i,
            Err(i) => {
                // One more, not double: the vector stays as long as the node's pairs.
                v.reserve_exact(1);
                v.insert(i, (agent.clone(), PairRec::default()));
                i
            }
        };
        &mut v[i].1
    }

    /// Every pair: (agent, node, record), a node's pairs together in agent order.
    pub fn iter(&self) -> impl Iterator<Item = (&Id, &Id, &PairRec)> {
        self.by_node.iter().flat_map(|(node, v)| v.iter().map(move |(agent, p)| (agent, node, p)))
    }

    /// One node's pairs: (agent, record), in agent order.
    pub fn of_node(&self, node: &str) -> &[(Id, PairRec)] {
        self.by_node.get(node).map(Vec::as_slice).unwrap_or_default()
    }

    /// Drops every pair of `node`.
    pub fn remove_node(&mut self, node: &str) {
        self.by_node.remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Id {
        s.into()
    }

    #[test]
    fn pairs_are_found_made_and_dropped_by_node() {
        let mut p = Pairs::default();
        assert!(p.get("a", "n1").is_none());
        for agent in ["c", "a", "b"] {
            p.entry(&id(agent), &id("n1")).next_n = 7;
        }
        p.entry(&id("a"), &id("n2")).next_n = 2;
        // An entry that exists is the same record, not a second one.
        p.entry(&id("a"), &id("n1")).next_n += 1;
        assert_eq!(p.iter().count(), 4);
        assert_eq!(p.get("a", "n1").map(|r| r.next_n), Some(8));
        assert_eq!(p.get("a", "n2").map(|r| r.next_n), Some(2));
        assert!(p.get("d", "n1").is_none() && p.get("b", "n2").is_none());
        let agents: Vec<&str> = p.of_node("n1").iter().map(|(a, _)| &**a).collect();
        assert_eq!(agents, ["a", "b", "c"], "a node's pairs are in agent order");
        assert_eq!(p.of_node("n1").len(), p.by_node["n1"].capacity(), "no room kept past the node's pairs");
        p.get_mut("b", "n1").expect("there").next_n = 1;
        let mut all: Vec<(String, String, u64)> =
            p.iter().map(|(a, n, r)| (a.to_string(), n.to_string(), r.next_n)).collect();
        all.sort();
        assert_eq!(
            all,
            [("a", "n1", 8), ("a", "n2", 2), ("b", "n1", 1), ("c", "n1", 7)].map(|(a, n, x)| (
                a.to_string(),
                n.to_string(),
                x
            ))
        );
        p.remove_node("n1");
        assert_eq!(p.iter().count(), 1);
        assert!(p.get("a", "n1").is_none() && p.of_node("n1").is_empty());
        p.remove_node("n2");
        assert_eq!(p.iter().count(), 0);
    }
}
