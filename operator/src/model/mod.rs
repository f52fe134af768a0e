//! Agents as the Control Plane describes them: the record (`agent`) and how the CP's items
//! are read into it (`read`), where a wrong optional field never stops an agent.

mod agent;
mod names;
mod read;
mod template;

pub use agent::*;
pub use names::{Interner, Names};
#[cfg(test)]
pub use read::raw_items;
pub use read::{parse_agents, FieldWarning, Read, SkippedAgent};
pub use template::{Shared, SpecId, Template};
