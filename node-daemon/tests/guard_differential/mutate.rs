//! The fuzzer's mutations of a create body, on a JSON tree that keeps what a `Value` cannot:
//! repeated keys, their order, and keys written with escapes. Each mutation is one of the ways
//! a body can be read differently by two decoders, or a weakening option put somewhere.

use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::Value;
use std::path::Path;

#[derive(Clone, Debug)]
pub enum Json {
    Leaf(Value),
    Arr(Vec<Json>),
    /// Members in order; a key may repeat. `escaped` writes the key as `\u` escapes.
    Obj(Vec<Member>),
}

#[derive(Clone, Debug)]
pub struct Member {
    key: String,
    escaped: bool,
    value: Json,
}

impl From<&Value> for Json {
    fn from(v: &Value) -> Json {
        match v {
            Value::Array(a) => Json::Arr(a.iter().map(Json::from).collect()),
            Value::Object(o) => Json::Obj(
                o.iter().map(|(k, v)| Member { key: k.clone(), escaped: false, value: Json::from(v) }).collect(),
            ),
            leaf => Json::Leaf(leaf.clone()),
        }
    }
}

impl Json {
    pub fn render(&self) -> String {
        match self {
            Json::Leaf(v) => v.to_string(),
            Json::Arr(a) => format!("[{}]", a.iter().map(Json::render).collect::<Vec<_>>().join(",")),
            Json::Obj(members) => {
                let inner: Vec<String> = members
                    .iter()
                    .map(|m| {
                        let key = if m.escaped {
                            format!("\"{}\"", m.key.chars().map(|c| format!("\\u{:04x}", c as u32)).collect::<String>())
                        } else {
                            Value::String(m.key.clone()).to_string()
                        };
                        format!("{key}:{}", m.value.render())
                    })
                    .collect();
                format!("{{{}}}", inner.join(","))
            }
        }
    }
}

/// Paths to the objects of the tree (indexes through arrays and members).
fn object_paths(j: &Json, at: Vec<usize>, out: &mut Vec<Vec<usize>>) {
    match j {
        Json::Leaf(_) => {}
        Json::Arr(a) => a.iter().enumerate().for_each(|(i, x)| object_paths(x, [at.clone(), vec![i]].concat(), out)),
        Json::Obj(members) => {
            out.push(at.clone());
            members.iter().enumerate().for_each(|(i, m)| object_paths(&m.value, [at.clone(), vec![i]].concat(), out));
        }
    }
}

fn at_path<'a>(j: &'a mut Json, path: &[usize]) -> &'a mut Json {
    match (j, path.split_first()) {
        (j, None) => j,
        (Json::Arr(a), Some((i, rest))) => at_path(&mut a[*i], rest),
        (Json::Obj(m), Some((i, rest))) => at_path(&mut m[*i].value, rest),
        (j, Some(_)) => j,
    }
}

/// A random object of the tree.
fn pick_object<'a>(j: &'a mut Json, rng: &mut impl Rng) -> &'a mut Vec<Member> {
    let mut paths = Vec::new();
    object_paths(j, vec![], &mut paths);
    let path = paths.choose(rng).cloned().unwrap_or_default();
    match at_path(j, &path) {
        Json::Obj(m) => m,
        _ => unreachable!("object_paths lists objects only"),
    }
}

/// Keys and values that weaken a container, wherever they land.
fn weakening(rng: &mut impl Rng, host: &Path) -> (String, Value) {
    let h = host.display();
    let options: Vec<(&str, Value)> = vec![
        ("Privileged", Value::Bool(true)),
        ("PidMode", "host".into()),
        ("IpcMode", "host".into()),
        ("UTSMode", "host".into()),
        ("UsernsMode", "host".into()),
        ("CgroupnsMode", "host".into()),
        ("NetworkMode", "host".into()),
        ("CapAdd", serde_json::json!(["SYS_ADMIN", "ALL"])),
        ("CapDrop", serde_json::json!([])),
        ("SecurityOpt", serde_json::json!(["seccomp=unconfined", "apparmor=unconfined"])),
        ("MaskedPaths", serde_json::json!([])),
        ("ReadonlyPaths", serde_json::json!([])),
        ("Binds", serde_json::json!(["/:/h"])),
        (
            "Devices",
            serde_json::json!([{"PathOnHost": "/dev/mem", "PathInContainer": "/dev/mem", "CgroupPermissions": "rwm"}]),
        ),
        ("PidsLimit", serde_json::json!(-1)),
        ("Memory", serde_json::json!(0)),
        ("MemorySwap", serde_json::json!(-1)),
        ("NanoCpus", serde_json::json!(0)),
        ("User", "0".into()),
        ("Type", "bind".into()),
        ("Source", "/".into()),
        ("ReadOnly", Value::Bool(false)),
        ("Source", format!("{h}/state/agents/evil/etc").into()),
        ("Source", format!("{h}/state").into()),
        ("Mounts", serde_json::json!([{"Type": "bind", "Source": "/", "Target": "/h"}])),
        (
            "VolumeOptions",
            serde_json::json!({"DriverConfig": {"Name": "local", "Options": {"type": "none", "o": "bind", "device": "/"}}}),
        ),
        ("Sysctls", serde_json::json!({"kernel.core_pattern": "|/h"})),
        ("Tmpfs", serde_json::json!({"/x": "exec"})),
        ("CgroupParent", "/".into()),
        ("OomKillDisable", Value::Bool(true)),
        ("Image", "fleet-test-agent:exit0".into()),
        ("Entrypoint", serde_json::json!(["/bin/busybox", "sh"])),
        ("PortBindings", serde_json::json!({"22/tcp": [{"HostPort": "2222"}]})),
        ("HostConfig", serde_json::json!({"Privileged": true})),
    ];
    let (k, v) = options.choose(rng).cloned().expect("options");
    (k.to_string(), v)
}

/// A key in another case, or with `ſ`/the Kelvin sign where Go folds them.
fn recase(key: &str, rng: &mut impl Rng) -> String {
    match rng.gen_range(0..4) {
        0 => key.to_lowercase(),
        1 => key.to_uppercase(),
        2 => key.replacen('s', "\u{17f}", 1).replacen('S', "\u{17f}", 1).replacen('k', "\u{212a}", 1),
        _ => {
            let mut chars: Vec<char> = key.chars().collect();
            if let Some(c) = chars.choose_mut(rng) {
                *c = if c.is_uppercase() { c.to_ascii_lowercase() } else { c.to_ascii_uppercase() };
            }
            chars.into_iter().collect()
        }
    }
}

/// Applies one random mutation; returns what it did.
pub fn mutate(body: &mut Json, rng: &mut impl Rng, host: &Path) -> String {
    let choice = rng.gen_range(0..6);
    let (key, value) = weakening(rng, host);
    let obj = pick_object(body, rng);
    let pick = (!obj.is_empty()).then(|| rng.gen_range(0..obj.len()));
    match (choice, pick) {
        (0, Some(i)) => {
            let old = obj[i].key.clone();
            obj[i].key = recase(&old, rng);
            format!("recased {old} as {}", obj[i].key)
        }
        (1, Some(i)) => {
            let dup = Member { key: obj[i].key.clone(), escaped: rng.gen(), value: Json::from(&value) };
            let at = rng.gen_range(0..=obj.len());
            obj.insert(at, dup);
            format!("repeated {} with {value}", obj[at].key)
        }
        (2, Some(i)) => {
            obj[i].escaped = true;
            format!("escaped {}", obj[i].key)
        }
        (3, Some(i)) => {
            let gone = obj.remove(i);
            format!("removed {}", gone.key)
        }
        (4, Some(i)) => {
            obj[i].value = Json::from(&value);
            format!("set {} to {value}", obj[i].key)
        }
        _ => {
            let at = rng.gen_range(0..=obj.len());
            let key = if rng.gen_bool(0.3) { recase(&key, rng) } else { key };
            obj.insert(at, Member { key: key.clone(), escaped: rng.gen_bool(0.2), value: Json::from(&value) });
            format!("added {key}: {value}")
        }
    }
}
