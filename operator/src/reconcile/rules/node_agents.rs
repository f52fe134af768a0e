//! One node's agents and their replica indexes there, as the pass keeps them for every node.
//! A node holds a handful of agents, so they are a vector sorted by key: 40 bytes an agent,
//! with no allocation of its own for up to two replicas of it. A B-tree would take a
//! ~450-byte leaf per node plus a vector per agent (~1.3 KB a node at rest, 13 MB at 10,000
//! nodes).

use crate::model::Id;
use smallvec::SmallVec;

/// An agent's replica indexes on one node, sorted.
pub type Reps = SmallVec<[u32; 2]>;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeAgents(Vec<(Id, Reps)>);

impl NodeAgents {
    fn find(&self, agent: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(key, _)| (**key).cmp(agent))
    }

    pub fn get(&self, agent: &str) -> Option<&Reps> {
        self.find(agent).ok().map(|i| &self.0[i].1)
    }

    pub fn get_mut(&mut self, agent: &str) -> Option<&mut Reps> {
        self.find(agent).ok().map(|i| &mut self.0[i].1)
    }

    pub fn contains_key(&self, agent: &str) -> bool {
        self.find(agent).is_ok()
    }

    pub fn remove(&mut self, agent: &str) -> Option<Reps> {
        self.find(agent).ok().map(|i| self.0.remove(i).1)
    }

    /// The agent's replica indexes, an empty set put in its place first if it has none.
    pub fn entry(&mut self, agent: &Id) -> &mut Reps {
        let i = match self.find(agent) {
            Ok(i) => i,
            Err(i) => {
                // One more, not double: when 1,000 nodes go offline, the 9,000 that receive a
                // replica each would double a full vector (10 agents, 400 bytes) to 800 bytes,
                // ~3 MB at the controller's peak.
                self.0.reserve_exact(1);
                self.0.insert(i, (agent.clone(), Reps::new()));
                i
            }
        };
        &mut self.0[i].1
    }

    pub fn keys(&self) -> impl Iterator<Item = &Id> {
        self.0.iter().map(|(key, _)| key)
    }

    pub fn values(&self) -> impl Iterator<Item = &Reps> {
        self.0.iter().map(|(_, reps)| reps)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Id, &Reps)> {
        self.0.iter().map(|(key, reps)| (key, reps))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Gives back room left by growth (the table is built once per full pass).
    pub fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
    }
}

impl<'a> IntoIterator for &'a NodeAgents {
    type Item = (&'a Id, &'a Reps);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (Id, Reps)>, fn(&'a (Id, Reps)) -> (&'a Id, &'a Reps)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(key, reps)| (key, reps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_stay_sorted_and_are_found_added_and_removed() {
        let mut m = NodeAgents::default();
        for (agent, r) in [("b", 1), ("a", 0), ("c", 4), ("a", 3), ("b", 0)] {
            let reps = m.entry(&Id::from(agent));
            if let Err(at) = reps.binary_search(&r) {
                reps.insert(at, r);
            }
        }
        let all: Vec<(&str, Vec<u32>)> = m.iter().map(|(k, r)| (&**k, r.to_vec())).collect();
        assert_eq!(all, vec![("a", vec![0, 3]), ("b", vec![0, 1]), ("c", vec![4])]);
        assert!(m.contains_key("b") && !m.contains_key("d"));
        assert_eq!(m.get("c").map(|r| r.to_vec()), Some(vec![4]));
        m.get_mut("a").unwrap().retain(|r| *r != 0);
        assert_eq!(m.remove("b").map(|r| r.to_vec()), Some(vec![0, 1]));
        assert_eq!(m.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["a", "c"]);
        assert_eq!(m.values().map(|r| r.len()).sum::<usize>(), 2);
        assert_eq!(m.remove("zz"), None);
        assert!(!m.is_empty());
    }

    /// A node's table grows by the agent it gains, not by half again.
    #[test]
    fn an_agent_added_to_a_full_table_grows_it_by_one() {
        let mut m = NodeAgents::default();
        for k in 0..10 {
            m.entry(&Id::from(format!("a{k:02}")));
        }
        m.shrink_to_fit();
        m.entry(&Id::from("b"));
        assert_eq!(m.0.capacity(), 11);
    }

    #[test]
    fn an_agent_with_two_replicas_on_a_node_takes_no_allocation_of_its_own() {
        let mut reps = Reps::new();
        reps.extend([3, 7]);
        assert!(!reps.spilled());
        assert_eq!(std::mem::size_of::<(Id, Reps)>(), 40);
    }
}
