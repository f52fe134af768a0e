//! `SIGKILL` while the node writes `desired.json`: afterwards the file is the old or the new
//! document, never a torn one. The writer is this test binary re-run as a child process
//! (`FLEET_WRITE_LOOP=<state dir>`), writing ever larger desired states through the same
//! `StateDir::save_desired` the daemon uses; the parent kills it at varied moments, 30 times.

use fleet_node::state::StateDir;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A desired-state document for generation `g`, big enough that a write takes a while.
fn doc(g: u64) -> Vec<u8> {
    let agents: Vec<serde_json::Value> = (0..(200 + g % 300))
        .map(|i| serde_json::json!({"agentKey": format!("agent-{i}"), "revision": g, "pad": "x".repeat(200)}))
        .collect();
    serde_json::to_vec(&serde_json::json!({"generation": g, "agents": agents})).unwrap()
}

fn writer_loop(dir: &Path) -> ! {
    let st = StateDir::open(dir).unwrap();
    let mut g = 1;
    loop {
        st.save_desired(&doc(g)).unwrap();
        g += 1;
    }
}

#[test]
fn desired_json_is_old_or_new_after_sigkill() {
    if let Ok(dir) = std::env::var("FLEET_WRITE_LOOP") {
        writer_loop(Path::new(&dir));
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let st = StateDir::open(&dir).unwrap();
    st.save_desired(&doc(0)).unwrap();
    let mut wrote = 0;
    let mut interrupted = 0;
    let leftovers = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".tmp-"))
            .count()
    };
    for round in 0..30u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "desired_json_is_old_or_new_after_sigkill", "--nocapture", "--test-threads=1"])
            .env("FLEET_WRITE_LOOP", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(40 + (round * 37) % 200));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let text = st.desired().unwrap().expect("desired.json exists after every kill");
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("round {round}: torn desired.json ({e}), {} bytes", text.len()));
        let g = v["generation"].as_u64().unwrap();
        assert_eq!(text.as_bytes(), doc(g).as_slice(), "round {round}: a whole document of generation {g}");
        wrote = wrote.max(g);
        // A kill inside a write leaves its temp file; opening the state dir (as the daemon does
        // at start) sweeps it and leaves desired.json alone.
        if leftovers(&dir) > 0 {
            interrupted += 1;
            StateDir::open(&dir).unwrap();
            assert_eq!(leftovers(&dir), 0, "round {round}: temp file swept");
            assert_eq!(st.desired().unwrap().as_deref(), Some(text.as_str()));
        }
    }
    assert!(wrote > 0, "the writer got through some writes");
    eprintln!("{interrupted} of 30 kills landed inside a write");
}

#[test]
fn opening_the_state_dir_sweeps_interrupted_writes_only() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let st = StateDir::open(&dir).unwrap();
    st.save_desired(b"{\"generation\":1,\"agents\":[]}").unwrap();
    std::fs::write(dir.join(".desired.json.tmp-4242"), b"{\"generation\":2,").unwrap();
    std::fs::write(dir.join("agents").join(".coder.pat.tmp-4242"), b"half").unwrap();
    StateDir::open(&dir).unwrap();
    assert!(!dir.join(".desired.json.tmp-4242").exists());
    assert!(!dir.join("agents").join(".coder.pat.tmp-4242").exists());
    assert_eq!(st.desired().unwrap().as_deref(), Some("{\"generation\":1,\"agents\":[]}"));
}
