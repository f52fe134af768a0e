use super::*;
use std::os::unix::fs::symlink;

fn at(secs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs as u64)
}

const NOW: i64 = 1_796_000_000;

#[test]
fn a_lease_is_a_time_after_now_in_rfc_3339_or_unix_seconds() {
    let now = at(NOW);
    assert_eq!(until(&format!("{}\n", NOW + 60), now), Some(NOW + 60));
    assert_eq!(until(&rfc3339(NOW + 60), now), Some(NOW + 60));
    assert_eq!(until("2026-11-30T02:00:00+01:00", now), Some(rfc_secs("2026-11-30T01:00:00Z")));
    for idle in ["", "\n", "   ", "0", &NOW.to_string(), &(NOW - 5).to_string(), "soon", "-5", "1e9", "12:00"] {
        assert_eq!(until(idle, now), None, "{idle:?}");
    }
    assert_eq!(rfc3339(NOW), "2026-11-30T00:53:20Z", "UTC, whole seconds");
    let cap = NOW + i64::from(fleet_api::rollout::MAX_BUSY_SECONDS);
    assert_eq!(until("99999999999999999999999", now), Some(cap), "at most the hard cap ahead");
    assert_eq!(until("9999-12-31T23:59:59Z", now), Some(cap));
}

fn rfc_secs(s: &str) -> i64 {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap().unix_timestamp()
}

/// A lease written before the container's current run began is the last run's: idle.
#[test]
fn a_lease_counts_only_from_the_run_it_was_written_in() {
    let lease = Lease { text: (NOW + 60).to_string(), written: at(NOW - 10) };
    assert_eq!(busy_until(Some(&lease), None, at(NOW)), Some(NOW + 60), "a container found running");
    assert_eq!(busy_until(Some(&lease), Some(at(NOW - 20)), at(NOW)), Some(NOW + 60));
    assert_eq!(busy_until(Some(&lease), Some(at(NOW - 5)), at(NOW)), None, "restarted since");
    let just_after = Lease { written: at(NOW - 10) - Duration::from_millis(5), ..lease };
    assert!(busy_until(Some(&just_after), Some(at(NOW - 10)), at(NOW)).is_some(), "a file's coarse clock");
    assert_eq!(busy_until(None, None, at(NOW)), None);
}

fn leases(t: &Path) -> Leases {
    Leases::new(&t.join("state"), &t.join("host-state"))
}

#[test]
fn a_container_gets_a_fresh_private_directory_and_its_lease_is_read_from_it() {
    let t = tempfile::tempdir().unwrap();
    let l = leases(t.path());
    l.prepare("fl-a-0", None).unwrap();
    let dir = t.path().join("state/leases/fl-a-0");
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(l.host_dir("fl-a-0"), t.path().join("host-state/leases/fl-a-0"));
    assert!(l.is_local("fl-a-0", &t.path().join("host-state/leases/fl-a-0").display().to_string()));
    assert!(!l.is_local("fl-a-0", "/var/lib/fleet-guard/0123456789abcdef/busy"));
    assert_eq!(l.read("fl-a-0"), Ok(None), "no file: idle");
    std::fs::write(dir.join(FILE), "1796000060").unwrap();
    assert_eq!(l.read("fl-a-0").unwrap().unwrap().text, "1796000060");
    // Made anew for a new container: the old lease is gone.
    l.prepare("fl-a-0", None).unwrap();
    assert_eq!(l.read("fl-a-0"), Ok(None));
    assert_eq!(l.read("fl-never-made"), Ok(None));
}

#[test]
fn no_link_is_followed_and_only_a_small_regular_file_is_read() {
    let t = tempfile::tempdir().unwrap();
    let l = leases(t.path());
    let secret = t.path().join("secret");
    std::fs::write(&secret, "1796000060").unwrap();
    l.prepare("fl-a-0", None).unwrap();
    let dir = t.path().join("state/leases/fl-a-0");
    symlink(&secret, dir.join(FILE)).unwrap();
    assert!(l.read("fl-a-0").unwrap_err().contains("symbolic link"));
    std::fs::remove_file(dir.join(FILE)).unwrap();
    std::fs::create_dir(dir.join(FILE)).unwrap();
    assert!(l.read("fl-a-0").unwrap_err().contains("not a regular file"));
    std::fs::remove_dir(dir.join(FILE)).unwrap();
    std::fs::write(dir.join(FILE), vec![b'1'; MAX_BYTES as usize + 1]).unwrap();
    assert!(l.read("fl-a-0").unwrap_err().contains("more than 64"));
    std::fs::write(dir.join(FILE), vec![b'1'; MAX_BYTES as usize]).unwrap();
    assert!(l.read("fl-a-0").is_ok(), "64 bytes is a lease");
    // A FIFO is not opened for reading in a way that blocks.
    std::fs::remove_file(dir.join(FILE)).unwrap();
    let made = std::process::Command::new("mkfifo").arg(dir.join(FILE)).status();
    if made.is_ok_and(|s| s.success()) {
        assert!(l.read("fl-a-0").unwrap_err().contains("not a regular file"));
    }
    // The directory itself swapped for a link.
    std::fs::remove_dir_all(&dir).unwrap();
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join(FILE), "1796000060").unwrap();
    symlink(&elsewhere, &dir).unwrap();
    assert!(l.read("fl-a-0").is_err(), "a linked directory is not read");
}

#[test]
fn directories_of_departed_containers_are_removed() {
    let t = tempfile::tempdir().unwrap();
    let l = leases(t.path());
    for name in ["fl-a-0", "fl-a-1", "fl-b-0"] {
        l.prepare(name, None).unwrap();
        std::fs::write(t.path().join("state/leases").join(name).join(FILE), "1").unwrap();
    }
    l.prune(&|n| n == "fl-a-1");
    let left: Vec<String> = std::fs::read_dir(t.path().join("state/leases"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec!["fl-a-1".to_string()]);
    l.remove("fl-a-1");
    assert!(!t.path().join("state/leases/fl-a-1").exists());
}
