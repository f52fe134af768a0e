//! A refused request (docs/behaviour.md#what-the-guard-checks-and-why): the rule it broke, as
//! the `403` body's `message` says it. Every check of the guard answers with one.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

pub fn refuse<T>(rule: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(rule.into()))
}
