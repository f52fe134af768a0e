//! Serving desired states: the body held for a node, let go once it is served, and read
//! back from the database when a node asks again (a restart).

use super::db::DbError;
use super::parts::Parts;
use super::records::DesiredRec;
use crate::model::Id;
use axum::body::Bytes;

impl Parts {
    /// The generation of `node`'s desired state and its body as served
    /// (`{"generation":G,"agents":[…]}`), `None` when it was let go ([`Parts::load_desired`]).
    pub fn desired_body(&self, node: &Id) -> Option<(u64, Option<Bytes>)> {
        self.registry.read().desired(node).map(|d| (d.generation, d.body()))
    }

    /// The node was served generation `generation`, or has it: its body is let go (the
    /// database keeps it), and so are the sealed boxes of the live credentials it carried —
    /// the node has them, and a later body reads them back.
    pub fn delivered(&self, node: &Id, generation: u64) {
        let held = |d: Option<&DesiredRec>| d.is_some_and(|d| d.generation == generation && d.is_held());
        if held(self.registry.read().desired(node)) {
            self.registry.write().delivered(node, generation);
        }
    }

    /// The body of `node`'s current desired state, read back from the database when it was
    /// let go; a newer stored generation (another replica's, docs/behaviour.md#high-availability) is taken on the way.
    /// `None` for a node that is gone.
    pub async fn load_desired(&self, node: &Id) -> Result<Option<(u64, Bytes)>, DbError> {
        let rows = self.db.desired(Some(&[node.to_string()])).await?;
        self.apply_desired(rows.clone());
        let stored = rows.first().map(|(_, g, agents)| (*g as u64, agents.as_str()));
        let mut st = self.registry.write();
        match st.read_back(node, stored) {
            Ok(rec) => Ok(rec.and_then(|r| r.body().map(|b| (r.generation, b)))),
            Err(held) => {
                Err(DbError::Other(format!("the stored desired state of node {node} is not generation {held}")))
            }
        }
    }
}
