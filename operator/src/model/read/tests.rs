use super::*;
use proptest::prelude::*;
use serde_json::json;

fn item(key: &str) -> Value {
    json!({"key": key, "revision": 4, "state": "running",
        "identity": {"kind": "agent", "iam": {"audiences": ["notification-service"],
                                             "scopeCeiling": ["control-plane:read"]}},
        "executor": {"kind": "claude-code", "image": "coder:1"},
        "placement": {"replicas": 3, "requires": ["repos"], "secrets": ["github-token"],
                      "resources": {"cpus": 2.0, "memoryMb": 4096}},
        "skills": {"audiences": ["mail"]}, "drainSeconds": 90})
}

fn read(items: Vec<Value>, previous: &[Agent]) -> Read {
    parse_agents(&raw_items(items), previous, &mut Interner::default())
}

/// `item` with the field at `path` (a JSON pointer) set to `v`.
fn with(path: &str, v: Value) -> Value {
    let mut it = item("coder");
    let (parent, last) = path.rsplit_once('/').unwrap();
    it.pointer_mut(parent).unwrap().as_object_mut().unwrap().insert(last.to_string(), v);
    it
}

/// Equal lists of names are one allocation: an agent's list that did not change is the one
/// of the list before (held beside the new one while it is read), and the agents new or
/// changed in a list share theirs.
#[test]
fn equal_lists_are_shared_within_a_list_and_with_the_list_before() {
    let old = read(vec![item("a")], &[]).agents;
    let mut gpu = item("b");
    gpu["placement"]["requires"] = json!(["gpu"]);
    let new = read(vec![item("a"), gpu, item("c")], &old).agents;
    let audiences = |a: &Agent| a.identity.iam.as_ref().unwrap().audiences.as_ptr();
    let requires = |a: &Agent| a.placed_spec().unwrap().requires.as_ptr();
    assert_eq!(audiences(&new[0]), audiences(&old[0]), "unchanged: the old list's");
    assert_eq!(requires(&new[0]), requires(&old[0]));
    assert_eq!(audiences(&new[1]), audiences(&new[2]), "agents new to the list share theirs");
    assert_ne!(requires(&new[1]), requires(&new[2]));
    assert_eq!(new[1].placed_spec().unwrap().requires, vec!["gpu"]);
    assert_eq!(new[0], old[0]);
}

#[test]
fn spec_example_parses_with_defaults() {
    let item = json!({"key": "coder", "revision": 4, "state": "running",
        "identity": {"kind": "agent", "iam": {"audiences": ["notification-service"],
                                             "scopeCeiling": ["control-plane:read"]}},
        "executor": {"kind": "claude-code", "image": null},
        "placement": {"replicas": 1, "requires": ["repos"], "secrets": ["github-token"],
                      "resources": {"cpus": 2.0, "memoryMb": 4096}},
        "skills": {"audiences": []}, "drainSeconds": 60, "somethingNew": {"x": 1}});
    let r = read(vec![item], &[]);
    assert!(r.skipped.is_empty() && r.warnings.is_empty(), "{r:?}");
    let a = &r.agents[0];
    assert_eq!(a.placed_spec().unwrap().requires, vec!["repos"]);
    assert_eq!(a.resources().memory_mb, Some(4096));

    let minimal = json!({"key": "m", "revision": 1, "state": "running",
        "identity": {"kind": "agent"}, "executor": {"kind": "k"}});
    let r = read(vec![minimal], &[]);
    let m = &r.agents[0];
    assert_eq!(m.placed_spec().unwrap().replicas, 1);
    assert_eq!(m.drain_seconds, 60);
    assert!(m.identity.iam.is_none());
}

/// Only a bad key, a missing `executor.kind` or a `state` that is neither value skips an
/// item; `placement: "none"` is an agent that is never placed.
#[test]
fn what_skips_an_item() {
    let none = json!({"key": "id-only", "revision": 1, "state": "running",
        "identity": {"kind": "agent"}, "executor": {"kind": "k"}, "placement": "none"});
    let bad_key = json!({"key": "Bad_Key", "revision": 1, "state": "running",
        "identity": {"kind": "agent"}, "executor": {"kind": "k"}});
    let no_state = json!({"key": "broken", "revision": "x"});
    let no_kind = json!({"key": "kindless", "revision": 1, "state": "running", "executor": {"image": "x"}});
    let odd_state = json!({"key": "odd", "revision": 1, "state": "paused", "executor": {"kind": "k"}});
    let not_object = json!(["coder"]);
    let r = read(vec![none, bad_key, no_state, no_kind, odd_state, not_object], &[]);
    assert_eq!(r.agents.len(), 1);
    assert!(r.agents[0].placed_spec().is_none());
    assert!(!r.agents[0].gets_status());
    let skipped: Vec<_> = r.skipped.iter().map(|b| (b.key.as_deref(), b.reason.as_str())).collect();
    assert_eq!(
        skipped,
        [
            (Some("Bad_Key"), "key \"Bad_Key\" does not match ^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"),
            (Some("broken"), "state (missing) is neither \"running\" nor \"stopped\""),
            (Some("kindless"), "executor.kind is missing"),
            (Some("odd"), "state \"paused\" is neither \"running\" nor \"stopped\""),
            (None, "the item is not an object"),
        ]
    );
}

/// docs/behaviour.md#wrong-input-never-stops-an-agent: `drainSeconds` is clamped to 0…3600;
/// a value that is not whole seconds keeps the last good one.
#[test]
fn drain_seconds_are_clamped_or_kept() {
    let drain = |d: Value, previous: &[Agent]| {
        let r = read(vec![with("/drainSeconds", d)], previous);
        (r.agents[0].drain_seconds, r.warnings.iter().map(|w| (w.field, w.used.clone())).collect::<Vec<_>>())
    };
    assert_eq!(drain(json!(86_400), &[]), (3600, vec![("drainSeconds", "3600".into())]));
    assert_eq!(drain(json!(3600), &[]), (3600, vec![]));
    assert_eq!(drain(json!(-1), &[]), (0, vec![("drainSeconds", "0".into())]));
    assert_eq!(drain(json!(u64::MAX), &[]), (3600, vec![("drainSeconds", "3600".into())]));
    assert_eq!(drain(json!("ten"), &[]), (60, vec![("drainSeconds", "its default".into())]));
    let previous = read(vec![item("coder")], &[]).agents;
    assert_eq!(drain(json!(1.5), &previous), (90, vec![("drainSeconds", "its last good value".into())]));
}

/// Every optional field that is malformed keeps the agent, takes the last good value (the
/// default for a new agent) and is named in a warning.
#[test]
fn a_malformed_optional_field_keeps_the_last_good_value() {
    let good = read(vec![item("coder")], &[]).agents;
    let cases: &[(&str, Value, &str)] = &[
        ("/revision", json!("five"), "revision"),
        ("/identity/kind", json!("robot"), "identity.kind"),
        ("/identity/iam", json!("all"), "identity.iam"),
        ("/identity/iam/audiences", json!("mail"), "identity.iam.audiences"),
        ("/identity/iam/scopeCeiling", json!({"a": 1}), "identity.iam.scopeCeiling"),
        ("/executor/image", json!(7), "executor.image"),
        ("/executor/image", json!("Not An Image!"), "executor.image"),
        ("/placement", json!("everywhere"), "placement"),
        ("/placement/replicas", json!("two"), "placement.replicas"),
        ("/placement/replicas", json!(-1), "placement.replicas"),
        ("/placement/replicas", json!(1_000_000), "placement.replicas"),
        ("/placement/requires", json!("repos"), "placement.requires"),
        ("/placement/secrets", json!([1, 2]), "placement.secrets"),
        ("/placement/resources", json!({"cpus": "two"}), "placement.resources"),
        ("/placement/resources/cpus", json!(-2.0), "placement.resources.cpus"),
        ("/skills", json!("mail"), "skills"),
        ("/skills/audiences", json!(null), "skills.audiences"),
    ];
    for (path, v, field) in cases {
        let r = read(vec![with(path, v.clone())], &good);
        assert!(r.skipped.is_empty(), "{path}: {r:?}");
        assert_eq!(r.agents, good, "{path} = {v}: the last good value stays");
        let named: Vec<_> = r.warnings.iter().map(|w| (w.agent.as_str(), w.field, w.used.as_str())).collect();
        assert_eq!(named, [("coder", *field, "its last good value")], "{path} = {v}");
    }
}

/// A new agent whose field is malformed takes the default; a ceiling that cannot be read
/// gives no scopes (never "no restriction", which is what an absent one means).
#[test]
fn a_new_agent_with_a_malformed_field_takes_the_default() {
    let r = read(vec![with("/placement/replicas", json!("two"))], &[]);
    assert_eq!(r.agents[0].placed_spec().unwrap().replicas, 1);
    assert_eq!(r.warnings[0].used, "its default");

    let r = read(vec![with("/identity/iam/scopeCeiling", json!("everything"))], &[]);
    assert_eq!(r.agents[0].identity.iam.as_ref().unwrap().scope_ceiling, Some(Names::default()));
    assert_eq!(r.warnings[0].used, "no scopes");
    let r = read(vec![with("/identity/iam", json!(true))], &[]);
    assert_eq!(r.agents[0].identity.iam.as_ref().unwrap().scope_ceiling, Some(Names::default()));

    let mut absent = item("coder");
    absent["identity"]["iam"].as_object_mut().unwrap().remove("scopeCeiling");
    let r = read(vec![absent], &[]);
    assert_eq!(r.agents[0].identity.iam.as_ref().unwrap().scope_ceiling, None);
    assert!(r.warnings.is_empty());
}

/// An item that must be skipped keeps its agent's last good version, with a warning; a new
/// agent's bad item is only skipped; a dropped agent is gone.
#[test]
fn a_skipped_item_keeps_the_last_good_version() {
    let previous = read(vec![item("coder"), item("mailer")], &[]).agents;
    let broken = json!({"key": "coder", "state": 7});
    let r = read(vec![broken, json!({"key": "fresh", "state": "running"})], &previous);
    assert_eq!(r.agents, previous[..1]);
    assert_eq!(r.skipped.len(), 2);
    assert_eq!(r.warnings.len(), 1);
    assert_eq!((r.warnings[0].agent.as_str(), r.warnings[0].field), ("coder", "item"));
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "[a-zA-Z0-9:_ -]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const OPTIONAL: &[&str] = &[
    "/revision",
    "/identity",
    "/identity/kind",
    "/identity/iam",
    "/identity/iam/audiences",
    "/identity/iam/scopeCeiling",
    "/executor/image",
    "/placement",
    "/placement/replicas",
    "/placement/requires",
    "/placement/secrets",
    "/placement/resources",
    "/skills",
    "/skills/audiences",
    "/drainSeconds",
];

proptest! {
    /// Whatever one optional field holds, the agent is kept, still running, of the same kind.
    #[test]
    fn no_optional_field_drops_a_running_agent(field in prop::sample::select(OPTIONAL), v in any_json()) {
        let previous = read(vec![item("coder")], &[]).agents;
        for prev in [&previous[..], &[]] {
            let r = read(vec![with(field, v.clone())], prev);
            prop_assert!(r.skipped.is_empty(), "{field} = {v}: {r:?}");
            prop_assert_eq!(r.agents.len(), 1);
            let a = &r.agents[0];
            prop_assert_eq!(a.state, AgentState::Running);
            prop_assert_eq!(a.executor.kind.as_str(), "claude-code");
            prop_assert!(a.drain_seconds <= MAX_DRAIN_SECONDS);
            if let Placement::Spec(s) = &a.placement {
                prop_assert!(s.replicas <= MAX_REPLICAS);
            }
        }
    }
}

/// docs/behaviour.md#spread-and-priority: `spread` and `priority` are read as written; an
/// invalid one takes its default where it is used, with a warning naming the field, and the
/// problem is there for the explanation.
#[test]
fn spread_and_priority_take_their_default_when_invalid() {
    let one = |spread: Value, priority: Value| {
        let mut it = item("coder");
        it["placement"]["spread"] = spread;
        it["placement"]["priority"] = priority;
        let r = read(vec![it], &[]);
        let a = &r.agents[0];
        let warned: Vec<&str> = r.warnings.iter().map(|w| w.field).collect();
        (a.spread().map(str::to_string), a.priority(), a.placement_problems().len(), warned)
    };
    assert_eq!(one(json!("zone"), json!(-1000)), (Some("zone".into()), -1000, 0, vec![]));
    assert_eq!(one(Value::Null, Value::Null), (None, 0, 0, vec![]));
    assert_eq!(
        one(json!("zone=a"), json!(1001)),
        (None, 0, 2, vec!["placement.spread", "placement.priority"]),
        "a label with a value is no label name; 1001 is out of range"
    );
    assert_eq!(one(json!(3), json!("high")), (None, 0, 2, vec!["placement.spread", "placement.priority"]));
    assert_eq!(one(json!("Zone"), json!(2.5)).3, vec!["placement.spread", "placement.priority"]);
}

/// The rollout policy is kept as the text the CP wrote, read by either path (the whole item
/// at once, or field by field when another field is wrong), parsed where it is used, stored
/// and read back as it came, and two items differ in it only when their texts do.
#[test]
fn the_rollout_policy_is_kept_as_its_text_and_parsed_where_used() {
    let policy = json!({"maxUnavailable": "50%", "minReadySeconds": 10});
    let strict = read(vec![with("/placement/rollout", policy.clone())], &[]).agents.remove(0);
    let mut lenient_item = with("/placement/rollout", policy.clone());
    lenient_item["drainSeconds"] = json!("soon");
    let lenient = read(vec![lenient_item], &[]);
    assert_eq!(lenient.warnings.len(), 1, "the wrong drainSeconds is read field by field");
    for a in [&strict, &lenient.agents[0]] {
        assert_eq!(a.rollout(), Some(policy.clone()));
    }
    let back: Agent = serde_json::from_str(&serde_json::to_string(&strict).unwrap()).unwrap();
    assert_eq!(back, strict);
    assert_eq!(back.rollout(), Some(policy));
    let other = read(vec![with("/placement/rollout", json!({"minReadySeconds": 11}))], &[]).agents.remove(0);
    assert_ne!(other, strict);
    assert_eq!(read(vec![item("coder")], &[]).agents[0].rollout(), None);
}
