//! A node's desired state as the registry holds it: its generation, and its body while the
//! node may still need it.

use super::cred::Cred;
use crate::model::Id;
use crate::store::kept::keyed_hash;
use axum::body::Bytes;
use std::sync::Arc;

/// A node's desired state as served. The whole body is built once per generation and
/// shared by every response (a clone is a reference count): waking 10,000 long-polls
/// copies nothing. Once it is served to the node (or the node shows it has the generation:
/// it asks with `since` = it, or reports it applied) the body is let go — the database keeps
/// it, and a node that asks again (its answer lost, a restart) has it read back — so at rest
/// the fleet's bodies take no memory. A sealed box is held in memory only until
/// its node has it: the registry keeps a new PAT's box until a body that carries it is
/// delivered, then the id alone ([`DesiredRec::let_go`]); a later body reads the box back.
#[derive(Debug, Clone)]
pub struct DesiredRec {
    pub generation: u64,
    /// A keyed hash of the agents array, for [`DesiredRec::same_agents`] once the body is gone.
    agents_hash: u64,
    /// `{"generation":G,"agents":[…]}` while the node may still need it.
    body: Option<Bytes>,
    /// The (agent, live credential) pairs whose boxes the body took from the registry's
    /// memory; kept without their boxes once the node has the body.
    boxed: Box<[(Id, Arc<Cred>)]>,
}

/// SipHash with a key chosen at start: the CP cannot craft two agent lists of one hash.
fn agents_hash(agents: &[u8]) -> u64 {
    keyed_hash(agents)
}

impl DesiredRec {
    /// `agents`: the JSON array of desired agents.
    pub fn new(generation: u64, agents: &str) -> DesiredRec {
        Self::build(generation, |body| body.extend_from_slice(agents.as_bytes()))
    }

    /// The body built in place: `write_agents` appends the JSON array of desired agents
    /// behind the head, so a pass serialises each body once, into the buffer that is served
    /// and whose slice is stored ([`DesiredRec::agents_bytes`]).
    pub fn build(generation: u64, write_agents: impl FnOnce(&mut Vec<u8>)) -> DesiredRec {
        let mut body = Self::head(generation).into_bytes();
        let at = body.len();
        write_agents(&mut body);
        let agents_hash = agents_hash(&body[at..]);
        body.push(b'}');
        body.shrink_to_fit();
        DesiredRec { generation, agents_hash, body: Some(body.into()), boxed: Box::default() }
    }

    /// The body carries these credentials' boxes, held in memory until the node has it.
    pub fn carrying(mut self, boxed: Vec<(Id, Arc<Cred>)>) -> DesiredRec {
        self.boxed = boxed.into_boxed_slice();
        self
    }

    /// A generation whose body is in the database only.
    pub fn stored(generation: u64, agents: &str) -> DesiredRec {
        DesiredRec { generation, agents_hash: agents_hash(agents.as_bytes()), body: None, boxed: Box::default() }
    }

    /// Whether this desired state has exactly these agents (a pass bumps the generation only
    /// when they differ).
    pub fn same_agents(&self, agents: &[u8]) -> bool {
        match self.agents_bytes() {
            Some(held) => held == agents,
            None => self.agents_hash == agents_hash(agents),
        }
    }

    fn head(generation: u64) -> String {
        format!("{{\"generation\":{generation},\"agents\":")
    }

    /// The JSON array of desired agents, while the body is held: a slice of the body that
    /// shares its memory (the pass stores it without a copy).
    pub fn agents_bytes(&self) -> Option<Bytes> {
        let body = self.body.as_ref()?;
        let at = Self::head(self.generation).len();
        Some(body.slice(at..body.len() - 1))
    }

    pub fn body(&self) -> Option<Bytes> {
        self.body.clone()
    }

    /// Whether the body is still held (the node may not have it yet).
    pub fn is_held(&self) -> bool {
        self.body.is_some()
    }

    /// The node has this generation: the body is let go (the database keeps it), and the
    /// credentials whose boxes it carried are handed back for the registry to keep boxless.
    pub fn let_go(&mut self) -> Box<[(Id, Arc<Cred>)]> {
        self.body = None;
        std::mem::take(&mut self.boxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_desired_state_is_served_as_built_and_its_agents_read_back() {
        let agents = r#"[{"agentKey":"a","note":"é"}]"#;
        let d = DesiredRec::new(7, agents);
        assert_eq!(d.agents_bytes().as_deref(), Some(agents.as_bytes()));
        let body: serde_json::Value = serde_json::from_slice(&d.body().unwrap()).unwrap();
        assert_eq!(body["generation"], 7);
        assert_eq!(body["agents"][0]["note"], "é");
        assert_eq!(DesiredRec::new(1, "[]").agents_bytes().as_deref(), Some(&b"[]"[..]));
        let stored = DesiredRec::stored(3, agents);
        assert_eq!(stored.body(), None);
        assert!(stored.same_agents(agents.as_bytes()) && d.same_agents(agents.as_bytes()));
        assert!(!stored.same_agents(b"[]") && !d.same_agents(b"[]"));
    }

    #[test]
    fn a_body_built_in_place_is_one_buffer_its_stored_agents_share() {
        let agents = r#"[{"agentKey":"b"}]"#;
        let built = DesiredRec::build(4, |b| b.extend_from_slice(agents.as_bytes()));
        assert_eq!(built.body(), DesiredRec::new(4, agents).body());
        let (body, slice) = (built.body().unwrap(), built.agents_bytes().unwrap());
        assert_eq!(&slice[..], agents.as_bytes());
        // The stored slice points into the served body: one copy of the JSON, not two.
        let inside = body.as_ptr_range();
        assert!(inside.contains(&slice.as_ptr()) && slice.as_ptr_range().end < inside.end);
        assert!(DesiredRec::stored(4, agents).same_agents(&slice));
    }

    #[test]
    fn a_body_let_go_is_no_longer_held_and_its_agents_still_compare() {
        let agents = r#"[{"agentKey":"b"}]"#;
        let mut d = DesiredRec::new(2, agents);
        assert!(d.is_held());
        assert!(d.let_go().is_empty());
        assert!(!d.is_held() && d.body().is_none());
        assert!(d.same_agents(agents.as_bytes()) && !d.same_agents(b"[]"));
    }

    #[test]
    fn a_desired_record_stays_small() {
        assert!(std::mem::size_of::<DesiredRec>() <= 64, "DesiredRec is {} bytes", std::mem::size_of::<DesiredRec>());
    }
}
