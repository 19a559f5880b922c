//! The `prism` command: start a cluster's nodes, see them, stop them.
//!
//! ```text
//! prism start --head --port 6380          # the head: control store + raylet
//! prism start --address HEAD:6380 --token T   # a node that joins
//! prism status                            # nodes, resources, waiting demand
//! prism stop                              # this machine's node processes
//! ```
//!
//! `prism start` runs the node in a background process (its output goes to
//! `<temp dir>/logs/`) and returns once it answers; `--block` keeps it in
//! the foreground instead, for containers and service managers.

mod dashboard;
mod node;
mod status;
mod stop;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "prism",
    version,
    about = "Start, inspect and stop the nodes of a Prism cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start a node on this machine: the head (--head) or one that joins a
    /// cluster (--address).
    Start(StartArgs),
    /// Show the cluster's nodes, their resources and what waits for
    /// resources.
    Status(StatusArgs),
    /// Stop this machine's Prism node processes (gracefully, then by force
    /// after the grace period).
    Stop(StopArgs),
}

/// TLS between nodes: all three files, or none (plain TCP).
#[derive(Args, Debug, Clone)]
struct TlsArgs {
    /// This node's certificate (PEM), signed by the cluster's CA and naming
    /// the node's IP address.
    #[arg(long, env = "PRISM_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "PRISM_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM).
    #[arg(long, env = "PRISM_TLS_CA")]
    tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The files given, made absolute (the node's workers and drivers read
    /// them from any folder): `None` when none was given.
    fn files(&self) -> Result<Option<prism_protocol::tls::TlsFiles>, String> {
        let absolute = |p: &Option<PathBuf>| -> Result<Option<PathBuf>, String> {
            p.as_ref()
                .map(|p| std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display())))
                .transpose()
        };
        prism_protocol::tls::TlsFiles::from_parts(
            absolute(&self.tls_cert)?,
            absolute(&self.tls_key)?,
            absolute(&self.tls_ca)?,
        )
        .map_err(|e| e.to_string())
    }

    /// Loads the files given, or those of this machine's node of the
    /// cluster at `head` (any node's when none is of it), and turns TLS on
    /// for this process when there are any.
    fn apply(&self, temp_dir: &std::path::Path, head: &str) -> Result<(), String> {
        let files = match self.files()? {
            Some(files) => Some(files),
            None => {
                let records = prism_raylet::NodeRecord::list(temp_dir);
                records
                    .iter()
                    .find(|r| r.head == head)
                    .or_else(|| records.first())
                    .and_then(|r| r.tls.clone())
            }
        };
        if let Some(files) = files {
            let tls = prism_protocol::tls::Tls::load(&files).map_err(|e| e.to_string())?;
            prism_protocol::tls::set(Some(tls));
        }
        Ok(())
    }
}

/// Where this machine's node records, token and sessions are kept.
#[derive(Args, Debug, Clone)]
struct TempDir {
    /// The folder for sessions, logs, node records and the token.
    #[arg(long, env = "PRISM_TEMP_DIR", default_value = "/tmp/prism")]
    temp_dir: PathBuf,
}

#[derive(Args, Debug, Clone)]
struct StartArgs {
    /// Start the head node: the cluster's control store and a raylet.
    #[arg(long, required_unless_present = "address", conflicts_with = "address")]
    head: bool,
    /// Join the cluster whose head listens at HOST:PORT.
    #[arg(long)]
    address: Option<String>,
    /// The head's port (with --head).
    #[arg(long, default_value_t = 6380)]
    port: u16,
    /// The address other nodes reach this one at (found from the route to
    /// the head, or to the outside for a head, when not given).
    #[arg(long)]
    node_ip_address: Option<String>,
    /// CPUs this node offers (default: every core).
    #[arg(long)]
    num_cpus: Option<u32>,
    /// GPUs this node offers (default: the NVIDIA devices present).
    #[arg(long)]
    num_gpus: Option<u32>,
    /// Memory offered to tasks, in bytes (default: the machine's).
    #[arg(long)]
    memory: Option<u64>,
    /// Object store capacity in bytes (default: 30% of memory).
    #[arg(long)]
    object_store_memory: Option<u64>,
    /// Custom resources as JSON, such as '{"disk": 2, "accel": 0.5}'.
    #[arg(long)]
    resources: Option<String>,
    /// The cluster token (joining nodes; the head makes one when not given).
    #[arg(long, env = "PRISM_AUTH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    temp: TempDir,
    /// The head's dashboard port (default 8265; when that default is taken
    /// the head starts without a dashboard and says so).
    #[arg(long)]
    dashboard_port: Option<u16>,
    /// The address the dashboard listens on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    dashboard_host: std::net::IpAddr,
    /// Whether the head serves a dashboard.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    include_dashboard: bool,
    /// Keep the node in the foreground until it is stopped.
    #[arg(long)]
    block: bool,
}

#[derive(Args, Debug, Clone)]
struct StatusArgs {
    /// The head, HOST:PORT (default: the cluster of this machine's nodes).
    #[arg(long, env = "PRISM_ADDRESS")]
    address: Option<String>,
    /// The cluster token (default: the one saved on this machine).
    #[arg(long, env = "PRISM_AUTH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// TLS files (default: those of this machine's node, if it has any).
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    temp: TempDir,
}

#[derive(Args, Debug, Clone)]
struct StopArgs {
    /// Kill at once (SIGKILL) instead of asking the nodes to leave.
    #[arg(long)]
    force: bool,
    /// Seconds to wait for a graceful stop before killing.
    #[arg(long, default_value_t = 10)]
    grace_period: u64,
    #[command(flatten)]
    temp: TempDir,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Start(args) => node::start(args),
        Command::Status(args) => status::run(args),
        Command::Stop(args) => stop::run(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("prism: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The token a command uses: given, or the one saved on this machine.
fn find_token(given: Option<&str>, temp_dir: &std::path::Path) -> Result<prism_gcs::Token, String> {
    prism_gcs::Token::find(given, temp_dir).map_err(|e| e.to_string())
}

/// A small multi-threaded runtime for the command's network calls.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}
