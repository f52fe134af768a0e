use super::*;
use fleet_api::{DesiredIdentity, Executor, Resources, SealedCredential};

fn cfg(dir: &Path) -> NodeConfig {
    let text = format!(
        "controllerUrl: http://127.0.0.1\nname: w1\ncapacity: {{slots: 4}}\nexecutors:\n  k: {{image: base:1, dataPath: /data, env: {{SHARED: kind, KIND_ONLY: x}}, images: [reg/obs:1.*]}}\nstateDir: {s}\nhostStateDir: /host/state\nsecretsDir: {x}\nhostSecretsDir: /host/secrets\nagentEnv: {{SHARED: agent, AGENT_ONLY: y}}\nnetwork: fleet-agents\n",
        s = dir.join("state").display(),
        x = dir.join("secrets").display()
    );
    NodeConfig::parse(&text, "t", &|_| None).unwrap()
}

fn agent(pk: &[u8; 32], image: Option<&str>, secrets: &[&str]) -> DesiredAgent {
    DesiredAgent {
        agent_key: "coder".into(),
        revision: 3,
        replica_indexes: vec![1, 0],
        executor: Executor { kind: "k".into(), image: image.map(str::to_string) },
        secrets: secrets.iter().map(|s| s.to_string()).collect(),
        resources: Resources { cpus: Some(1.5), memory_mb: Some(512) },
        drain_seconds: 60,
        identity: DesiredIdentity {
            principal_id: "prn_1".into(),
            tenant_id: "t1".into(),
            credential: SealedCredential {
                credential_id: "cred_1".into(),
                ciphertext: fleet_api::seal::seal(pk, b"pat_secret"),
                expires_at: "2030-01-01T00:00:00Z".into(),
            },
        },
        spec_id: Some("0a1b2c3d".into()),
        restart: 0,
    }
}

fn setup() -> (tempfile::TempDir, NodeConfig, StateDir, [u8; 32], [u8; 32]) {
    let t = tempfile::tempdir().unwrap();
    let c = cfg(t.path());
    std::fs::create_dir_all(&c.secrets_dir).unwrap();
    let st = StateDir::open(&c.state_dir).unwrap();
    let (sk, pk) = fleet_api::seal::generate_keypair();
    (t, c, st, sk, pk)
}

#[test]
fn container_spec_per_spec_6_5() {
    let (_t, c, st, sk, pk) = setup();
    std::fs::write(c.secrets_dir.join("github-token"), "x").unwrap();
    let d = DesiredState { generation: 1, agents: vec![agent(&pk, None, &["github-token"])] };
    let p = plan(&d, &c, &st, &sk);
    assert_eq!(p.wanted.len(), 2);
    assert_eq!(p.wanted[0].replica, 0, "replicas in order");
    let Plan::Run(s) = &p.wanted[1].plan else { panic!("{:?}", p.wanted[1].plan) };
    assert_eq!(s.name, "fleet-coder-1");
    assert_eq!(s.image, "base:1");
    assert_eq!(
        s.env,
        vec![
            "AGENT_ONLY=y",
            "CONTROL_PLANE_AGENT_KEY=coder",
            "CONTROL_PLANE_IAM_TENANT=t1",
            "FLEET_REPLICA=1",
            "IAM_PRINCIPAL=prn_1",
            "KIND_ONLY=x",
            "SHARED=kind",
        ],
        "the kind's env beats agentEnv; Fleet's own beat both"
    );
    assert_eq!(
        s.binds[0],
        Bind { source: "/host/state/agents/coder/agent-pat".into(), target: "/run/secrets/agent-pat".into() }
    );
    assert_eq!(
        s.binds[1],
        Bind { source: "/host/secrets/github-token".into(), target: "/run/secrets/github-token".into() }
    );
    assert_eq!(s.volume, Some(("fleet-coder-1-data".into(), "/data".into())));
    assert_eq!((s.nano_cpus, s.memory_bytes), (Some(1_500_000_000), Some(512 * 1024 * 1024)));
    assert_eq!(s.network.as_deref(), Some("fleet-agents"));
    for (k, v) in [("fleet.managed", "1"), ("fleet.node", "w1"), ("fleet.agent", "coder"), ("fleet.replica", "1")] {
        assert_eq!(s.labels[k], v);
    }
    assert_eq!(std::fs::read(st.pat_path("coder")).unwrap(), b"pat_secret", "the PAT is opened to the state dir");
}

#[test]
fn spec_hash_covers_exactly_what_forces_a_recreate() {
    let (_t, c, _st, _sk, pk) = setup();
    let base = agent(&pk, None, &[]);
    let h = |a: &DesiredAgent, c: &NodeConfig| spec(a, 0, "base:1", c).hash().to_string();
    let h0 = h(&base, &c);
    let mut rev = base.clone();
    rev.revision = 4;
    rev.drain_seconds = 5;
    rev.identity.credential.ciphertext = "other".into();
    assert_eq!(h(&rev, &c), h0, "revision, drain and the ciphertext alone do not recreate");
    let mut cred = base.clone();
    cred.identity.credential.credential_id = "cred_2".into();
    assert_ne!(h(&cred, &c), h0, "a new PAT credential recreates");
    let mut res = base.clone();
    res.resources.memory_mb = Some(1024);
    assert_ne!(h(&res, &c), h0);
    let mut sec = base.clone();
    sec.secrets = vec!["a".into()];
    assert_ne!(h(&sec, &c), h0);
    assert_ne!(spec(&base, 0, "base:2", &c).hash(), h0, "image");
    assert_ne!(spec(&base, 1, "base:1", &c).hash(), h0, "name");
    let mut c2 = c.clone();
    c2.network = None;
    assert_ne!(h(&base, &c2), h0, "network");
    let mut c3 = c.clone();
    c3.agent_env.insert("NEW".into(), "1".into());
    assert_ne!(h(&base, &c3), h0, "environment");
    let mut c4 = c.clone();
    c4.executors.get_mut("k").unwrap().data_path = Some("/other".into());
    assert_ne!(h(&base, &c4), h0, "dataPath");
    let mut c5 = c.clone();
    c5.executors.get_mut("k").unwrap().cap_add = vec!["NET_BIND_SERVICE".into()];
    assert_ne!(h(&base, &c5), h0, "the kind's capabilities");
}

/// docs/behaviour.md#hardening: an agent without resources gets the kind's defaults; one above the maximum is
/// clamped and its report says so; the kind's hardening reaches the spec.
#[test]
fn default_and_maximum_resources_and_hardening_per_kind() {
    let (_t, mut c, st, sk, pk) = setup();
    let k = c.executors.get_mut("k").unwrap();
    k.default_resources = Some(crate::config::ResourceLimits { cpus: Some(0.5), memory_mb: Some(256) });
    k.max_resources = Some(crate::config::ResourceLimits { cpus: Some(1.0), memory_mb: Some(1024) });
    k.cap_add = vec!["NET_BIND_SERVICE".into()];
    k.pids_limit = Some(200);
    k.user = Some("10001:10001".into());
    let mut bare = agent(&pk, None, &[]);
    bare.resources = Resources { cpus: None, memory_mb: None };
    let mut big = agent(&pk, None, &[]);
    big.agent_key = "big".into();
    big.resources = Resources { cpus: Some(4.0), memory_mb: Some(512) };
    let d = DesiredState { generation: 1, agents: vec![bare, big] };
    let p = plan(&d, &c, &st, &sk);
    let spec_of = |agent: &str| match &p.wanted.iter().find(|w| w.agent == agent).unwrap().plan {
        Plan::Run(s) => s.clone(),
        other => panic!("{other:?}"),
    };
    let bare = spec_of("coder");
    assert_eq!((bare.nano_cpus, bare.memory_bytes), (Some(500_000_000), Some(256 * 1024 * 1024)), "the defaults");
    assert_eq!(bare.note, None);
    let big = spec_of("big");
    assert_eq!((big.nano_cpus, big.memory_bytes), (Some(1_000_000_000), Some(512 * 1024 * 1024)), "cpus clamped");
    assert_eq!(big.note.as_deref(), Some("resources clamped to executors.k.maxResources: cpus 4 → 1"));
    assert_eq!(
        big.hardening,
        crate::runtime::Hardening {
            cap_add: vec!["NET_BIND_SERVICE".into()],
            pids_limit: 200,
            user: Some("10001:10001".into())
        }
    );
    let plain = spec(&agent(&pk, None, &[]), 0, "base:1", &setup().1);
    let me = std::fs::metadata("/proc/self").map(|m| {
        use std::os::unix::fs::MetadataExt;
        // Never root unless node.yaml names it: a node running as root gives nobody.
        if m.uid() == 0 {
            "65534:65534".to_string()
        } else {
            format!("{}:{}", m.uid(), m.gid())
        }
    });
    let expected = crate::runtime::Hardening { user: me.ok(), ..Default::default() };
    assert_eq!(plain.hardening, expected, "1024 pids, no capabilities, the node's own user (not root)");
}

#[test]
fn refusals_cost_nothing_and_say_why() {
    let (_t, c, st, sk, pk) = setup();
    let refuse = |a: DesiredAgent, key: &[u8; 32]| {
        let p = plan(&DesiredState { generation: 1, agents: vec![a] }, &c, &st, key);
        match &p.wanted[0].plan {
            Plan::Refuse(m) => m.clone(),
            other => panic!("{other:?}"),
        }
    };
    let mut kind = agent(&pk, None, &[]);
    kind.executor.kind = "other".into();
    assert_eq!(refuse(kind, &sk), "executor kind other is not configured on this node");
    assert_eq!(
        refuse(agent(&pk, Some("reg/evil:1"), &[]), &sk),
        "image_not_allowed: image reg/evil:1 is not allowed for executor kind k"
    );
    assert_eq!(refuse(agent(&pk, None, &["missing"]), &sk), "secret missing is missing on this node");
    let (other_sk, _) = fleet_api::seal::generate_keypair();
    assert_eq!(refuse(agent(&pk, None, &[]), &other_sk), CREDENTIAL_UNOPENABLE);
    let p = plan(&DesiredState { generation: 1, agents: vec![agent(&pk, Some("reg/obs:1.4"), &[])] }, &c, &st, &sk);
    assert!(matches!(&p.wanted[0].plan, Plan::Run(s) if s.image == "reg/obs:1.4"), "an admitted agent image runs");
}

#[test]
fn secrets_announced_by_the_name_rule() {
    let t = tempfile::tempdir().unwrap();
    for f in ["github-token", "README", "agent.pat", "agent-pat", "ok-2"] {
        std::fs::write(t.path().join(f), "x").unwrap();
    }
    std::fs::create_dir(t.path().join("subdir")).unwrap();
    assert_eq!(read_secrets(t.path()).into_iter().collect::<Vec<_>>(), vec!["github-token", "ok-2"]);
    // docs/behaviour.md#hardening: a symlink is neither announced nor mounted, whatever it points at (a node
    // whose secretsDir is writable by others must not bind /etc/shadow into an agent).
    std::os::unix::fs::symlink("/etc/hostname", t.path().join("linked")).unwrap();
    std::os::unix::fs::symlink(t.path().join("github-token"), t.path().join("alias")).unwrap();
    assert_eq!(read_secrets(t.path()).into_iter().collect::<Vec<_>>(), vec!["github-token", "ok-2"]);
}

/// docs/behaviour.md#secrets: a kind that lists its secrets mounts only those. A replica of
/// another kind naming a secret outside its own list is refused like a missing secret — with
/// `secret_not_allowed: …`, before the file is even looked at — and on the fake runtime that
/// costs no Docker call and reports `stopped` with the message; the kind that lists it runs.
#[tokio::test(start_paused = true)]
async fn a_secret_outside_the_kinds_list_is_refused_secret_not_allowed() {
    use crate::runtime::fake::FakeRuntime;
    use crate::supervisor::Supervisor;
    let t = tempfile::tempdir().unwrap();
    let text = format!(
        "controllerUrl: http://127.0.0.1\nname: w1\ncapacity: {{slots: 4}}\nexecutors:\n  k: {{image: base:1, secrets: [github-token]}}\n  observer: {{image: obs:1, secrets: [mail]}}\nstateDir: {s}\nsecretsDir: {x}\n",
        s = t.path().join("state").display(),
        x = t.path().join("secrets").display()
    );
    let c = NodeConfig::parse(&text, "t", &|_| None).unwrap();
    std::fs::create_dir_all(&c.secrets_dir).unwrap();
    for s in ["github-token", "mail"] {
        std::fs::write(c.secrets_dir.join(s), "x").unwrap();
    }
    let st = StateDir::open(&c.state_dir).unwrap();
    let (sk, pk) = fleet_api::seal::generate_keypair();
    let mut thief = agent(&pk, None, &["github-token"]);
    thief.agent_key = "thief".into();
    thief.executor.kind = "observer".into();
    thief.replica_indexes = vec![0];
    let mut coder = agent(&pk, None, &["github-token"]);
    coder.replica_indexes = vec![0];
    let p = plan(&DesiredState { generation: 1, agents: vec![thief, coder] }, &c, &st, &sk);
    let want = "secret_not_allowed: secret github-token is not offered to executor kind observer on this node";
    assert_eq!(p.wanted[0].plan, Plan::Refuse(want.into()));
    assert_eq!(fleet_api::codes::refusal::code_of(want), Some("secret_not_allowed"));
    assert!(matches!(&p.wanted[1].plan, Plan::Run(_)), "the kind that lists it runs: {:?}", p.wanted[1].plan);

    let rt = FakeRuntime::default();
    let mut sup = Supervisor::new(rt.clone());
    let refused = [p.wanted[0].clone()];
    let drains = p.drains.clone();
    for _ in 0..3 {
        sup.tick(&refused, &drains, &c.container_prefix).await.unwrap();
    }
    let r = sup.reports(&refused).remove(0);
    assert_eq!((r.state, r.restarts, r.message.as_deref()), (fleet_api::ReplicaState::Stopped, 0, Some(want)));
    assert!(rt.calls().is_empty(), "no Docker call for a refused replica: {:?}", rt.calls());
}

/// docs/behaviour.md#rolling-out-a-change: the container carries the template's name, a
/// restart stamp recreates it with nothing else changed, and the name alone does not.
#[test]
fn the_template_name_labels_the_container_and_a_restart_stamp_changes_the_spec() {
    let (_t, cfg, _state, _sk, pk) = setup();
    let a = agent(&pk, None, &[]);
    let s = spec(&a, 0, "img:1", &cfg);
    assert_eq!(s.labels.get(crate::runtime::LABEL_SPEC_ID).map(String::as_str), Some("0a1b2c3d"));
    let mut renamed = a.clone();
    renamed.spec_id = Some("0a1b2c3e".into());
    assert_eq!(spec(&renamed, 0, "img:1", &cfg).hash(), s.hash(), "the name alone recreates nothing");
    let mut restarted = a.clone();
    restarted.restart = 1;
    assert_ne!(spec(&restarted, 0, "img:1", &cfg).hash(), s.hash());
    let mut bad = a.clone();
    bad.spec_id = Some("NOT A NAME".into());
    assert!(!spec(&bad, 0, "img:1", &cfg).labels.contains_key(crate::runtime::LABEL_SPEC_ID));
}

/// The hash of one fixed container, written out: a change of what the spec serialises (a
/// field added, renamed or reordered) changes every container's hash, and a node upgraded
/// onto such a build recreates every container it adopts (docs/behaviour.md#container-rules).
/// A new field must leave this value as it is while it holds its default.
#[test]
fn the_spec_hash_of_a_fixed_container_is_the_one_every_release_computed() {
    let (_t, mut c, _st, _sk, pk) = setup();
    c.executors.get_mut("k").unwrap().user = Some("10001:10001".into());
    let s = spec(&agent(&pk, None, &["github-token"]), 1, "base:1", &c);
    assert_eq!(s.hash(), "45ed71a08f8e92fbf28bf399");
}
