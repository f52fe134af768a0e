//! Test-only failpoints shared by both programs, so the supervision tests can make a task end
//! or stall in the real binaries. `FLEET_FAILPOINTS=<dir>` turns them on: a point is on
//! while a file of its name exists in that directory (so a test can switch it at run time).
//! Compiled only with the `failpoints` feature (on by default in both programs; the release
//! images leave it out); without the variable a check is one load of a cached `None`.

/// Whether failpoints can fire in this process at all.
pub fn enabled() -> bool {
    dir().is_some()
}

/// Whether `point` is on now.
pub fn on(point: &str) -> bool {
    dir().is_some_and(|d| d.join(point).exists())
}

#[cfg(feature = "failpoints")]
fn dir() -> Option<&'static std::path::Path> {
    use std::sync::OnceLock;
    static DIR: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("FLEET_FAILPOINTS").map(Into::into)).as_deref()
}

#[cfg(not(feature = "failpoints"))]
fn dir() -> Option<&'static std::path::Path> {
    None
}
