//! Test-only failpoints, so the supervision tests can make a core task end or the pass stall
//! in the real binary. `FLEET_FAILPOINTS=<dir>` turns them on: a point is on while a file of
//! its name exists in that directory (so a test can switch it at run time). Compiled only
//! with the `failpoints` feature (on by default; the release images leave it out), and
//! without the variable a check is one load of a cached `None`.

#[cfg(feature = "failpoints")]
pub fn on(point: &str) -> bool {
    use std::path::PathBuf;
    use std::sync::OnceLock;
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    let dir = DIR.get_or_init(|| std::env::var_os("FLEET_FAILPOINTS").map(PathBuf::from));
    dir.as_ref().is_some_and(|d| d.join(point).exists())
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn on(_point: &str) -> bool {
    false
}
