//! Clients of the platform's Control Plane and IAM (docs/behaviour.md#the-platform-control-plane-and-iam): the only code that knows their
//! URLs and bodies, so a deployment can adapt them without touching the reconciler.

pub mod client;
pub mod cp;
pub mod error;
pub mod gate;
pub mod iam;
pub mod token;

pub use client::{http_client, http_client_trusting};
pub use error::PlatformError;
pub use gate::CallGate;
