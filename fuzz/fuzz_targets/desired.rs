//! The node's desired-state decoder and planner: whatever the controller (or a corrupted
//! desired.json) says, the node decodes it or refuses it, and plans containers without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

struct Env {
    _dir: tempfile::TempDir,
    cfg: fleet_node::config::NodeConfig,
    state: fleet_node::state::StateDir,
    key: [u8; 32],
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "controllerUrl: http://127.0.0.1\nname: w1\ncapacity: {{slots: 4}}\nexecutors:\n  k: {{image: base:1, dataPath: /data, images: [reg/obs:1.*]}}\nstateDir: {s}\nhostStateDir: /host/state\nsecretsDir: {x}\nhostSecretsDir: /host/secrets\n",
            s = dir.path().join("state").display(),
            x = dir.path().join("secrets").display()
        );
        let cfg = fleet_node::config::NodeConfig::parse(&text, "fuzz", &|_| None).unwrap();
        std::fs::create_dir_all(&cfg.secrets_dir).unwrap();
        let state = fleet_node::state::StateDir::open(&cfg.state_dir).unwrap();
        let (key, _) = fleet_api::seal::generate_keypair();
        Env { _dir: dir, cfg, state, key }
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = fleet_node::daemon::parse_desired(data) {
        let e = env();
        let _ = fleet_node::plan::plan(&d, &e.cfg, &e.state, &e.key);
    }
});
