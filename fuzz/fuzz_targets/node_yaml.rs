//! node.yaml: `${VAR}` substitution, YAML parsing and every validation rule, on arbitrary text.
//! Must return Ok or a ConfigError, never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let env = |k: &str| (k.len() % 2 == 0).then(|| format!("v-{k}"));
        if let Ok(cfg) = fleet_node::config::NodeConfig::parse(text, "fuzz.yaml", &env) {
            // A config that passed validation must survive being used.
            let _ = format!("{cfg:?}");
        }
    }
});
