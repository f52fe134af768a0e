// Two items below are the allocators' documented start-up hooks; nothing else is unsafe.
#![deny(unsafe_code)]
//! `fleet-controller`: a thin shell over the library.

use clap::{Parser, Subcommand};
use fleet_controller::config::{Config, LogFormat, StoreConfig};
#[cfg(feature = "dev")]
use fleet_controller::dev;
use fleet_controller::{clock, server, store::Store};
use std::process::ExitCode;
use std::time::Duration;

/// jemalloc instead of glibc's malloc: at fleet scale (thousands of connections, ~100,000
/// replicas) it holds 15–20 % less resident memory at the same CPU
/// (docs/performance.md#where-the-bytes-are), and its counters feed the `fleet_memory_*`
/// gauges. The feature `system-allocator` keeps glibc's malloc, which heaptrack can follow
/// (profiling only).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's defaults for this process, read by name before its first allocation (the
/// `_RJEM_MALLOC_CONF` environment variable still overrides them):
/// - freed pages given back at once instead of kept dirty: while many nodes' replicas move,
///   desired bodies, a pass's rows and PAT calls are freed faster than a delayed purge gives
///   them back, and at 10,000 nodes that slack (tens of MiB) would be the peak RSS; purging
///   at once costs no measurable CPU;
/// - one arena, and thread caches of at most 32 objects a size class and none above 4 KiB:
///   a fleet-wide rollout replaces 20,000 records and their node lists every pass, and
///   with two arenas and the default caches the freed places were spread over twice the
///   slabs and held in the caches — 10 MiB of slabs in use but empty at the peak, against 5.
///   No slower at 10,000 nodes (docs/performance.md#where-the-bytes-are).
#[cfg(not(feature = "system-allocator"))]
#[allow(unsafe_code)] // a symbol jemalloc looks up; no code runs
#[export_name = "_rjem_malloc_conf"]
pub static JEMALLOC_CONF: &[u8; 110] =
    b"background_thread:true,narenas:1,tcache_max:4096,tcache_nslots_small_max:32,dirty_decay_ms:0,muzzy_decay_ms:0\0";

/// glibc's malloc still serves C code (SQLite, on its connection threads): at most two arenas,
/// so each of those threads does not keep a heap of its own with its own fragmentation, and
/// fixed thresholds for giving memory back. Left to itself glibc raises both after the first
/// large block is freed (up to 32 MiB, and twice that before trimming), so the memory a big
/// SQLite transaction took would stay with the process: several MiB at 10,000 nodes
/// (docs/performance.md#where-the-bytes-are).
fn limit_glibc_arenas() {
    const GIVE_BACK: libc::c_int = 128 * 1024;
    // SAFETY: mallopt only changes malloc tunables; each takes any positive value.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, GIVE_BACK);
        libc::mallopt(libc::M_TRIM_THRESHOLD, GIVE_BACK);
    }
}

#[derive(Parser)]
#[command(name = "fleet-controller", version, propagate_version = true, about = "Places AI-agent replicas on Docker hosts, gives each an identity and a sealed PAT, and reports their state to the Control Plane.", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller (the default). Configured by FLEET_* environment variables.
    Serve,
    /// Write a one-time join key straight into the store and print it with its expiry.
    JoinKey {
        /// Lifetime in seconds, 60 … 604800.
        #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(60..=604_800))]
        ttl: u64,
        /// Free text kept with the key, e.g. the machine it is for.
        #[arg(long, default_value = "")]
        note: String,
        /// A label pattern the node may claim (name, name=value or name=*); repeat it. Without
        /// it the node may claim any label.
        #[arg(long = "allow-label", value_name = "PATTERN")]
        allow_label: Vec<String>,
        /// An executor kind the node may claim; repeat it. Without it, any kind.
        #[arg(long = "allow-kind", value_name = "KIND")]
        allow_kind: Vec<String>,
    },
    /// Write a consistent copy of the store (FLEET_DATABASE_URL) to a file while a controller
    /// serves it, and print what it holds.
    Backup {
        /// The file to write, mode 0600 (replaced whole when it exists); `{time}` in it becomes
        /// the UTC time of the backup, e.g. /backups/fleet-{time}.sqlite.
        #[arg(long, value_name = "FILE")]
        out: std::path::PathBuf,
        /// With `{time}` in --out: keep only the newest N backups of that name, removing older ones.
        #[arg(long, value_name = "N")]
        keep: Option<usize>,
    },
    /// Replace the store (FLEET_DATABASE_URL) with a backup; refused while a controller serves it.
    Restore {
        /// A file `fleet-controller backup` wrote.
        #[arg(value_name = "FILE")]
        file: std::path::PathBuf,
    },
    /// Work on stores while no controller serves them.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// Exit 0 when /healthz answers on the port of FLEET_LISTEN at 127.0.0.1.
    Healthcheck,
    /// Print the API contract (OpenAPI 3.1 JSON), as checked in at openapi/fleet.json.
    Openapi,
    /// Print the FleetNode and FleetPlacement CRD YAML, as checked in under crds/.
    Crds,
    /// Run a whole fleet on this machine: controller, in-memory CP and IAM, example agents.
    #[cfg(feature = "dev")]
    Dev(dev::DevArgs),
    /// Not in this build: release images leave the dev mode (and its token-minting IAM) out.
    #[cfg(not(feature = "dev"))]
    #[command(hide = true)]
    Dev {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
}

/// Fields as the default text format writes them (`name=value`, the message bare), with
/// every control character in a value escaped.
fn escaping_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        let text = fleet_api::text::escape_controls(&text);
        match field.name() {
            "message" => write!(w, "{text}"),
            name => write!(w, "{name}={text}"),
        }
    })
    .delimited(" ")
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Copy every row of one store into another, empty one (SQLite or PostgreSQL, either way;
    /// no controller may serve either), then check the two alike table by table.
    Copy {
        /// The store to copy: sqlite://PATH or postgres://USER@HOST/DB.
        #[arg(long, value_name = "URL")]
        from: String,
        /// The empty store to copy into (created and migrated when new).
        #[arg(long, value_name = "URL")]
        to: String,
    },
    /// Mark the store (FLEET_DATABASE_URL) as restored by other means than `restore` (pg_restore,
    /// a point-in-time recovery, a volume snapshot): the controller catches up with the fleet.
    MarkRestored,
}

fn init_logs(format: LogFormat) {
    let wanted = fleet_controller::k8s::health::log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let filter = tracing_subscriber::EnvFilter::try_new(&wanted).unwrap_or_else(|_| "info".into());
    // Colours only on a terminal: logs written to files and collectors stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    // Text lines escape control characters in every field: what a node, the CP or a client
    // wrote cannot start a line of its own (docs/behaviour.md#hardening).
    let b = b.fmt_fields(escaping_fields());
    match format {
        LogFormat::Json => b.json().init(),
        LogFormat::Text => b.init(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    limit_glibc_arenas();
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => serve().await,
        Command::JoinKey { ttl, note, allow_label, allow_kind } => {
            join_key(ttl, &note, allowance(allow_label, allow_kind)).await
        }
        Command::Backup { out, keep } => backup(&out, keep).await,
        Command::Restore { file } => restore(&file).await,
        Command::Store { command: StoreCommand::Copy { from, to } } => copy_store(&from, &to).await,
        Command::Store { command: StoreCommand::MarkRestored } => mark_restored().await,
        Command::Healthcheck => healthcheck().await,
        Command::Openapi => {
            print!("{}", fleet_controller::http::openapi::document());
            Ok(())
        }
        Command::Crds => {
            print!("{}", fleet_controller::k8s::crd::crds_yaml());
            Ok(())
        }
        #[cfg(feature = "dev")]
        Command::Dev(args) => {
            init_logs(LogFormat::Text);
            dev::run(args).await
        }
        #[cfg(not(feature = "dev"))]
        Command::Dev { .. } => Err(anyhow::anyhow!(
            "this build has no dev mode (built without the `dev` feature, as the release images are); \
             run `cargo run -p fleet-controller -- dev` from a source checkout"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet-controller: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve() -> anyhow::Result<()> {
    let cfg = Config::from_env()?;
    init_logs(cfg.log_format);
    if let Some(path) = std::env::var_os("FLEET_MEMORY_TRACE") {
        fleet_controller::metrics::trace_memory(path.into())?;
    }
    let mut running = server::start(cfg).await?;
    tokio::select! {
        () = shutdown_signal() => {}
        ended = running.ended() => {
            tracing::error!(task = ended.task, "{ended}; exiting so that the orchestrator restarts the controller");
            anyhow::bail!("{ended}");
        }
    }
    tracing::info!("shutting down");
    running.shutdown().await;
    Ok(())
}

pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The allowance of repeated `--allow-label` and `--allow-kind` flags: a flag not given allows
/// anything of its kind (docs/behaviour.md#what-a-node-may-claim).
fn allowance(labels: Vec<String>, kinds: Vec<String>) -> fleet_api::claims::Allowance {
    fleet_api::claims::Allowance {
        allowed_labels: (!labels.is_empty()).then_some(labels),
        allowed_kinds: (!kinds.is_empty()).then_some(kinds),
    }
}

async fn join_key(ttl: u64, note: &str, allowed: fleet_api::claims::Allowance) -> anyhow::Result<()> {
    allowed.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let sc = StoreConfig::from_env();
    let store = Store::open(&sc.database_url)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the store {}: {e}", sc.database_url))?;
    let (key, expires) = store.issue_join_key(Duration::from_secs(ttl), note, &allowed).await?;
    println!("{key}");
    eprintln!("expires at {}", clock::rfc3339_ms(expires));
    Ok(())
}

async fn backup(template: &std::path::Path, keep: Option<usize>) -> anyhow::Result<()> {
    use fleet_controller::backup::schedule;
    let url = StoreConfig::from_env().database_url;
    let started = std::time::Instant::now();
    let out = schedule::out_file(template, clock::now_ms());
    let w = fleet_controller::backup::backup(&url, &out).await?;
    let (secs, url) = (started.elapsed().as_secs_f64(), server::redact(&url));
    println!("backup of {url} written to {} (mode 0600, {} bytes) in {secs:.2} s", w.file.display(), w.bytes);
    println!("{}", w.summary);
    if let Some(keep) = keep {
        for old in schedule::prune(template, keep.max(1))? {
            println!("removed the older backup {}", old.display());
        }
    }
    Ok(())
}

async fn restore(file: &std::path::Path) -> anyhow::Result<()> {
    let url = StoreConfig::from_env().database_url;
    let r = fleet_controller::backup::restore(file, &url).await?;
    println!("restored {} from {}", server::redact(&url), file.display());
    println!("{}", r.summary);
    if let Some(aside) = r.set_aside {
        println!("the store it replaced is kept at {}", aside.display());
    }
    if !r.tables.is_empty() {
        print!("{}", fleet_controller::backup::copy::report(&r.tables));
    }
    println!(
        "the controller catches up with the fleet when it starts (docs/behaviour.md#a-store-older-than-the-fleet)"
    );
    Ok(())
}

async fn copy_store(from: &str, to: &str) -> anyhow::Result<()> {
    let tables = fleet_controller::backup::copy_store(from, to).await?;
    println!("copied {} into {}, every table checked alike:", server::redact(from), server::redact(to));
    print!("{}", fleet_controller::backup::copy::report(&tables));
    Ok(())
}

async fn mark_restored() -> anyhow::Result<()> {
    let url = StoreConfig::from_env().database_url;
    fleet_controller::backup::mark_restored(&url).await?;
    println!("{} marked as restored: the controller catches up with the fleet when it starts", server::redact(&url));
    Ok(())
}

async fn healthcheck() -> anyhow::Result<()> {
    let listen = std::env::var("FLEET_LISTEN").unwrap_or_else(|_| fleet_controller::config::defaults::LISTEN.into());
    let port = listen.rsplit(':').next().unwrap_or("8040");
    let url = format!("http://127.0.0.1:{port}/healthz");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(3)).redirect(reqwest::redirect::Policy::none());
    let resp = client.build()?.get(&url).send().await?;
    anyhow::ensure!(resp.status().is_success(), "{url} answered {}", resp.status());
    Ok(())
}
