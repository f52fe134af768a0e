#![forbid(unsafe_code)]
//! End-to-end test helpers.
