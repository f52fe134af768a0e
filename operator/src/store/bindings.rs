//! The placement's bindings: the node each bound replica is on.
//!
//! Held as a table of the bound agents, each with where its replicas start, and one sorted
//! vector of 8-byte entries (replica index, node as a position in a table of node ids): at
//! 100,000 replicas of 20,000 agents 1.3 MB, where an entry naming its agent (24 bytes) took
//! 2.4 MB and a B-tree of `(Arc<str>, u32) → Arc<str>` ~4.4 MB. Two or three outcomes are
//! alive while a pass places, the controller's peak. A placement run writes the new entries
//! straight into their vector instead of collecting them and building a tree beside it.

use crate::model::Id;

/// (agent key, replica index) → node id, ordered by agent key, then replica.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    /// Node ids, sorted and unique: an entry's node is a position here.
    nodes: Vec<Id>,
    /// The agents with a bound replica, sorted and unique, each with the position of its
    /// first entry: its entries run to the next agent's first.
    agents: Vec<(Id, u32)>,
    /// Grouped by agent in `agents`' order, each agent's in replica order, each replica once.
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    replica: u32,
    node: u32,
}

impl Bindings {
    pub fn new() -> Bindings {
        Bindings::default()
    }

    /// From a node table (sorted, unique) and `count` entries already in (agent, replica)
    /// order whose node is a position in it: what a placement run produces.
    pub(crate) fn from_sorted(nodes: Vec<Id>, count: usize, rows: impl Iterator<Item = (Id, u32, u32)>) -> Bindings {
        debug_assert!(nodes.windows(2).all(|w| w[0] < w[1]), "node table sorted and unique");
        let mut agents: Vec<(Id, u32)> = Vec::new();
        let mut entries = Vec::with_capacity(count);
        for (agent, replica, node) in rows {
            debug_assert!((node as usize) < nodes.len(), "nodes in the table");
            match agents.last() {
                Some((last, _)) if *last == agent => {
                    debug_assert!(entries.last().is_some_and(|e: &Entry| e.replica < replica), "replicas in order");
                }
                last => {
                    debug_assert!(last.is_none_or(|(l, _)| *l < agent), "agents in order");
                    agents.push((agent, entries.len() as u32));
                }
            }
            entries.push(Entry { replica, node });
        }
        agents.shrink_to_fit();
        entries.shrink_to_fit();
        Bindings { nodes, agents, entries }
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
        let entries = self.entries_of(self.agent_at(agent)?);
        let at = entries.binary_search_by(|e| e.replica.cmp(&replica)).ok()?;
        Some(&self.nodes[entries[at].node as usize])
    }

    pub fn contains(&self, agent: &str, replica: u32) -> bool {
        self.get(agent, replica).is_some()
    }

    /// Every binding in order: (agent, replica, node).
    pub fn iter(&self) -> impl Iterator<Item = (&Id, u32, &Id)> + '_ {
        self.positions().map(|(agent, replica, node)| (agent, replica, &self.nodes[node as usize]))
    }

    /// Every binding in order with its node as a position in the node table.
    pub(crate) fn positions(&self) -> impl Iterator<Item = (&Id, u32, u32)> + '_ {
        (0..self.agents.len()).flat_map(move |i| {
            let agent = &self.agents[i].0;
            self.entries_of(i).iter().map(move |e| (agent, e.replica, e.node))
        })
    }

    /// One agent's bindings in replica order: (replica, node). A binary search, then a walk
    /// over the agent's few entries.
    pub fn of_agent<'a>(&'a self, agent: &'a str) -> impl Iterator<Item = (u32, &'a Id)> + 'a {
        let entries = self.agent_at(agent).map(|i| self.entries_of(i)).unwrap_or_default();
        entries.iter().map(|e| (e.replica, &self.nodes[e.node as usize]))
    }

    /// How many replicas are bound to `node` (a scan: an admin's action, not a hot path).
    pub fn count_on(&self, node: &str) -> u32 {
        let Some(at) = self.position(node) else { return 0 };
        self.entries.iter().filter(|e| e.node as usize == at).count() as u32
    }

    /// The agent's position in the agent table.
    fn agent_at(&self, agent: &str) -> Option<usize> {
        self.agents.binary_search_by(|(a, _)| (**a).cmp(agent)).ok()
    }

    /// The entries of the agent at position `i` of the agent table.
    fn entries_of(&self, i: usize) -> &[Entry] {
        let from = self.agents[i].1 as usize;
        let to = self.agents.get(i + 1).map_or(self.entries.len(), |a| a.1 as usize);
        &self.entries[from..to]
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
        Bindings::from_sorted(nodes, entries.len(), entries.into_iter())
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

    /// 100,000 replicas of 20,000 agents: 0.8 MB of entries and 0.5 MB of agents.
    #[test]
    fn a_binding_is_8_bytes_and_an_agent_with_bindings_24() {
        assert_eq!(std::mem::size_of::<Entry>(), 8);
        assert_eq!(std::mem::size_of::<(Id, u32)>(), 24);
        let b = sample();
        assert_eq!((b.agents.len(), b.entries.len()), (2, 4));
        assert_eq!(b.agents.capacity(), 2);
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
        let b = Bindings::from_sorted(nodes, rows.len(), rows.into_iter());
        assert_eq!(a, b);
        let c: Bindings = [(id("a"), 0, id("n2"))].into_iter().collect();
        assert_ne!(a, c);
    }
}
