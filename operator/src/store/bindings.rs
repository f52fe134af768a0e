//! The placement's bindings: the node each bound replica is on.
//!
//! Held as one sorted vector of 24-byte entries that name their node by its position in a
//! table of node ids: at 100,000 replicas 2.4 MB, where a B-tree of `(Arc<str>, u32) →
//! Arc<str>` would take ~4.4 MB. A placement run, the controller's peak, writes the new
//! entries straight into their vector instead of collecting them and building a tree beside
//! it.

use crate::model::Id;

/// (agent key, replica index) → node id, ordered by agent key, then replica.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    /// Node ids, sorted and unique: an entry's node is a position here.
    nodes: Vec<Id>,
    /// Sorted by (agent, replica), each replica once.
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    agent: Id,
    replica: u32,
    node: u32,
}

impl Bindings {
    pub fn new() -> Bindings {
        Bindings::default()
    }

    /// From a node table (sorted, unique) and entries already in (agent, replica) order whose
    /// node is a position in it: what a placement run produces.
    pub(crate) fn from_sorted(nodes: Vec<Id>, entries: impl Iterator<Item = (Id, u32, u32)>) -> Bindings {
        let entries: Vec<Entry> = entries.map(|(agent, replica, node)| Entry { agent, replica, node }).collect();
        debug_assert!(nodes.windows(2).all(|w| w[0] < w[1]), "node table sorted and unique");
        debug_assert!(entries.windows(2).all(|w| w[0].key() < w[1].key()), "entries in order");
        debug_assert!(entries.iter().all(|e| (e.node as usize) < nodes.len()), "nodes in the table");
        Bindings { nodes, entries }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The node table: every node this placement saw (or, loaded from the database, every
    /// node with a binding), sorted by id.
    pub fn nodes(&self) -> &[Id] {
        &self.nodes
    }

    /// A node's position in the node table.
    pub fn position(&self, node: &str) -> Option<usize> {
        self.nodes.binary_search_by(|n| (**n).cmp(node)).ok()
    }

    pub fn get(&self, agent: &str, replica: u32) -> Option<&Id> {
        let at = self.entries.binary_search_by(|e| e.key().cmp(&(agent, replica))).ok()?;
        Some(self.node_of(&self.entries[at]))
    }

    pub fn contains(&self, agent: &str, replica: u32) -> bool {
        self.get(agent, replica).is_some()
    }

    /// Every binding in order: (agent, replica, node).
    pub fn iter(&self) -> impl Iterator<Item = (&Id, u32, &Id)> + '_ {
        self.entries.iter().map(|e| (&e.agent, e.replica, self.node_of(e)))
    }

    /// Every binding in order with its node as a position in the node table.
    pub(crate) fn positions(&self) -> impl Iterator<Item = (&Id, u32, u32)> + '_ {
        self.entries.iter().map(|e| (&e.agent, e.replica, e.node))
    }

    /// One agent's bindings in replica order: (replica, node). A binary search, then a walk
    /// over the agent's few entries.
    pub fn of_agent<'a>(&'a self, agent: &'a str) -> impl Iterator<Item = (u32, &'a Id)> + 'a {
        let from = self.entries.partition_point(|e| &*e.agent < agent);
        self.entries[from..].iter().take_while(move |e| &*e.agent == agent).map(|e| (e.replica, self.node_of(e)))
    }

    /// How many replicas are bound to `node` (a scan: an admin's action, not a hot path).
    pub fn count_on(&self, node: &str) -> u32 {
        let Some(at) = self.position(node) else { return 0 };
        self.entries.iter().filter(|e| e.node as usize == at).count() as u32
    }

    fn node_of(&self, e: &Entry) -> &Id {
        &self.nodes[e.node as usize]
    }
}

impl Entry {
    fn key(&self) -> (&str, u32) {
        (&self.agent, self.replica)
    }
}

/// Bindings in any order; a replica named twice is bound to its last node (as inserting
/// into a map would). For the database's rows and for tests.
impl FromIterator<(Id, u32, Id)> for Bindings {
    fn from_iter<I: IntoIterator<Item = (Id, u32, Id)>>(iter: I) -> Bindings {
        let mut rows: Vec<(Id, u32, Id)> = iter.into_iter().collect();
        // Stable: of a replica's rows the last stays last, and dedup keeps the first of a run.
        rows.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        rows.reverse();
        rows.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        rows.reverse();
        let mut nodes: Vec<Id> = rows.iter().map(|r| r.2.clone()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let entries = rows.into_iter().map(|(agent, replica, node)| {
            let at = nodes.binary_search(&node).expect("every row's node is in the table");
            (agent, replica, at as u32)
        });
        let entries: Vec<(Id, u32, u32)> = entries.collect();
        Bindings::from_sorted(nodes, entries.into_iter())
    }
}

/// Equal when they bind the same replicas to the same nodes, whatever else the node tables
/// hold.
impl PartialEq for Bindings {
    fn eq(&self, other: &Bindings) -> bool {
        self.len() == other.len() && self.iter().zip(other.iter()).all(|(a, b)| a.0 == b.0 && a.1 == b.1 && a.2 == b.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Id {
        Id::from(s)
    }

    fn sample() -> Bindings {
        [(id("b"), 1, id("n2")), (id("a"), 0, id("n1")), (id("b"), 0, id("n1")), (id("a"), 2, id("n3"))]
            .into_iter()
            .collect()
    }

    #[test]
    fn bindings_are_kept_in_agent_then_replica_order() {
        let b = sample();
        let seen: Vec<(&str, u32, &str)> = b.iter().map(|(a, r, n)| (&**a, r, &**n)).collect();
        assert_eq!(seen, [("a", 0, "n1"), ("a", 2, "n3"), ("b", 0, "n1"), ("b", 1, "n2")]);
        assert_eq!(b.nodes(), [id("n1"), id("n2"), id("n3")]);
    }

    #[test]
    fn a_replica_is_found_by_agent_and_index() {
        let b = sample();
        assert_eq!(b.get("a", 2).map(|n| &**n), Some("n3"));
        assert_eq!(b.get("a", 1), None);
        assert_eq!(b.get("c", 0), None);
        assert!(b.contains("b", 1));
        let of_b: Vec<(u32, &str)> = b.of_agent("b").map(|(r, n)| (r, &**n)).collect();
        assert_eq!(of_b, [(0, "n1"), (1, "n2")]);
        assert_eq!(b.of_agent("ab").count(), 0);
        assert_eq!(b.count_on("n1"), 2);
        assert_eq!(b.count_on("n9"), 0);
    }

    #[test]
    fn a_replica_named_twice_keeps_its_last_node() {
        let b: Bindings = [(id("a"), 0, id("n1")), (id("a"), 0, id("n2"))].into_iter().collect();
        assert_eq!(b.len(), 1);
        assert_eq!(b.get("a", 0).map(|n| &**n), Some("n2"));
        // The node no binding names is not kept in the table.
        assert_eq!(b.nodes(), [id("n2")]);
    }

    #[test]
    fn equal_bindings_compare_equal_whatever_their_node_tables() {
        let a = sample();
        let nodes = vec![id("n0"), id("n1"), id("n2"), id("n3")];
        let rows =
            a.iter().map(|(ag, r, n)| (ag.clone(), r, nodes.binary_search(n).unwrap() as u32)).collect::<Vec<_>>();
        let b = Bindings::from_sorted(nodes, rows.into_iter());
        assert_eq!(a, b);
        let c: Bindings = [(id("a"), 0, id("n2"))].into_iter().collect();
        assert_ne!(a, c);
    }
}
