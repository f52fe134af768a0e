#![forbid(unsafe_code)]
//! Helpers for tests that need the real Docker engine: whether to run them (`FLEET_E2E=1`
//! makes Docker mandatory; without it they skip when Docker is absent), and the locally built
//! `FROM scratch` test images (the engine here has no registry to pull from). Std only, so any
//! crate's tests can use it.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

/// The repository of the test agent images.
pub const TEST_IMAGE: &str = "fleet-test-agent";

/// Tags built, each with its behaviour baked in (see `assets/agent.sh`).
pub const TAGS: &[(&str, &str)] = &[
    ("sleep", "sleep"),
    ("sleep2", "sleep"),
    ("exit0", "exit:0"),
    ("exit75", "exit:75"),
    ("exit1", "exit:1"),
    ("ignore-term", "ignore-term"),
];

pub fn image(tag: &str) -> String {
    format!("{TEST_IMAGE}:{tag}")
}

fn docker_ok() -> bool {
    Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether Docker tests run. With `FLEET_E2E=1` a missing engine or busybox is a failure.
pub fn docker_available() -> bool {
    let required = std::env::var("FLEET_E2E").as_deref() == Ok("1");
    let docker = docker_ok();
    let busybox = Path::new(BUSYBOX).exists();
    if required {
        assert!(docker, "FLEET_E2E=1 but the Docker engine is not reachable");
        assert!(busybox, "FLEET_E2E=1 but {BUSYBOX} is missing: apt-get install busybox-static");
    }
    if !(docker && busybox) {
        eprintln!("skipping: Docker or {BUSYBOX} not available (set FLEET_E2E=1 to require them)");
    }
    docker && busybox
}

const BUSYBOX: &str = "/bin/busybox";

/// Builds every test image once per process (each build is a few MB, from scratch).
pub fn ensure_test_images() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fleet-test-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(BUSYBOX, dir.join("busybox")).unwrap();
        std::fs::write(dir.join("agent.sh"), include_str!("../assets/agent.sh")).unwrap();
        std::fs::write(
            dir.join("Dockerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\nCOPY agent.sh /agent.sh\nARG BEHAVIOR=sleep\nENV BEHAVIOR=$BEHAVIOR\nENTRYPOINT [\"/bin/busybox\", \"sh\", \"/agent.sh\"]\n",
        )
        .unwrap();
        for (tag, behaviour) in TAGS {
            let out = Command::new("docker")
                .args(["build", "-q", "--build-arg", &format!("BEHAVIOR={behaviour}"), "-t", &image(tag)])
                .arg(&dir)
                .env("DOCKER_BUILDKIT", "0")
                .output()
                .expect("docker build runs");
            assert!(out.status.success(), "building {}: {}", image(tag), String::from_utf8_lossy(&out.stderr));
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// `docker inspect` of one object as JSON text.
pub fn inspect(name: &str) -> Option<String> {
    let out = Command::new("docker").args(["inspect", name]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).to_string())
}

/// Removes containers and volumes whose name starts with `prefix` (test cleanup).
pub fn cleanup(prefix: &str) {
    let out = Command::new("docker").args(["ps", "-aq", "--filter", &format!("name=^{prefix}")]).output();
    if let Ok(o) = out {
        let ids: Vec<String> = String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect();
        if !ids.is_empty() {
            let _ = Command::new("docker").arg("rm").arg("-f").args(&ids).output();
        }
    }
    let out = Command::new("docker").args(["volume", "ls", "-q", "--filter", &format!("name=^{prefix}")]).output();
    if let Ok(o) = out {
        let vols: Vec<String> = String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect();
        if !vols.is_empty() {
            let _ = Command::new("docker").args(["volume", "rm", "-f"]).args(&vols).output();
        }
    }
}

/// Builds `fleet-controller:e2e` and `fleet-node:e2e` (static binaries, FROM scratch) with
/// `scripts/build-images.sh`, once per process, unless both exist already (CI builds them
/// before the tests, dynamically linked from the test build's dependencies). Here always the
/// static build, in its own target dir: the dynamic one replaces target/debug/fleet-controller
/// and fleet-node, which the tests running beside this one use.
pub fn ensure_fleet_images() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let have =
            |i: &str| Command::new("docker").args(["image", "inspect", i]).output().is_ok_and(|o| o.status.success());
        if have("fleet-controller:e2e") && have("fleet-node:e2e") && std::env::var("FLEET_E2E_REBUILD").is_err() {
            return;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let st = Command::new("bash")
            .arg(root.join("scripts/build-images.sh"))
            .arg("e2e")
            .env("FLEET_IMAGE_PROFILE", std::env::var("FLEET_IMAGE_PROFILE").unwrap_or_else(|_| "dev".into()))
            .env("FLEET_IMAGE_LINK", "static")
            .current_dir(root)
            .status()
            .expect("scripts/build-images.sh runs");
        assert!(st.success(), "building the fleet images failed");
    });
}
