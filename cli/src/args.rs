//! The arguments of the `prism` subcommands, and the TLS and temp-folder
//! options they share.

use clap::Args;
use std::path::PathBuf;

/// TLS between nodes: all three files, or none (plain TCP).
#[derive(Args, Debug, Clone)]
pub(crate) struct TlsArgs {
    /// This node's certificate (PEM), signed by the cluster's CA and naming
    /// the node's IP address.
    #[arg(long, env = "PRISM_TLS_CERT")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "PRISM_TLS_KEY")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM).
    #[arg(long, env = "PRISM_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The files given, made absolute (the node's workers and drivers read
    /// them from any folder): `None` when none was given.
    pub(crate) fn files(&self) -> Result<Option<prism_protocol::tls::TlsFiles>, String> {
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
    pub(crate) fn apply(&self, temp_dir: &std::path::Path, head: &str) -> Result<(), String> {
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
pub(crate) struct TempDir {
    /// The folder for sessions, logs, node records and the token
    /// (default: /tmp/prism for root, /tmp/prism-<uid> for other users).
    #[arg(
        long,
        env = "PRISM_TEMP_DIR",
        default_value_os_t = prism_protocol::guard::default_temp_dir()
    )]
    pub(crate) temp_dir: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct StartArgs {
    /// Start the head node: the cluster's control store and a raylet.
    #[arg(
        long,
        required_unless_present_any = ["address", "slurm"],
        conflicts_with = "address"
    )]
    pub(crate) head: bool,
    /// Inside a Slurm allocation (under `srun`): the allocation's first
    /// node starts the head, the others join it, each with the CPUs and
    /// GPUs Slurm gave it (docs/slurm.md).
    #[arg(long, conflicts_with_all = ["head", "address", "token", "token_file"])]
    pub(crate) slurm: bool,
    /// Join the cluster whose head listens at HOST:PORT.
    #[arg(long)]
    pub(crate) address: Option<String>,
    /// The head's port (with --head).
    #[arg(long, default_value_t = 6380)]
    pub(crate) port: u16,
    /// The address other nodes reach this one at (found from the route to
    /// the head, or to the outside for a head, when not given).
    #[arg(long)]
    pub(crate) node_ip_address: Option<String>,
    /// CPUs this node offers (default: every core).
    #[arg(long)]
    pub(crate) num_cpus: Option<u32>,
    /// GPUs this node offers (default: the NVIDIA devices present).
    #[arg(long)]
    pub(crate) num_gpus: Option<u32>,
    /// Memory offered to tasks, in bytes (default: the machine's).
    #[arg(long)]
    pub(crate) memory: Option<u64>,
    /// Object store capacity in bytes (default: 30% of memory).
    #[arg(long)]
    pub(crate) object_store_memory: Option<u64>,
    /// Custom resources as JSON, such as '{"disk": 2, "accel": 0.5}'.
    #[arg(long)]
    pub(crate) resources: Option<String>,
    /// The cluster token (joining nodes; the head makes one when not
    /// given). Give it with --token-file or PRISM_AUTH_TOKEN instead: a
    /// value on the command line can be read by every user of the machine.
    #[arg(long, env = "PRISM_AUTH_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// A file holding the cluster token, such as the head's
    /// `<temp dir>/token` copied here (wins over --token).
    #[arg(long)]
    pub(crate) token_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
    #[command(flatten)]
    pub(crate) temp: TempDir,
    #[command(flatten)]
    pub(crate) dashboard: DashboardArgs,
    /// Keep the node in the foreground until it is stopped.
    #[arg(long)]
    pub(crate) block: bool,
    /// Where the head keeps its control store's state (the key-value
    /// table, actor names, members, the cluster's id and token), so that a
    /// head started again resumes its cluster. Default
    /// `<temp dir>/head-<port>`, removed when the head is stopped; a folder
    /// given here is kept (put it on a disk that outlives the machine, or a
    /// pod's volume).
    #[arg(long)]
    pub(crate) state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) redis: RedisArgs,
    /// The port this node serves Prometheus metrics on (`/metrics`, on its
    /// node address, behind the cluster token); 0 picks a free one. The
    /// head lists every node's in `<temp dir>/prom_metrics_service_discovery.json`.
    #[arg(long, default_value_t = 0)]
    pub(crate) metrics_export_port: u16,
}

/// The head's dashboard.
#[derive(Args, Debug, Clone)]
pub(crate) struct DashboardArgs {
    /// The head's dashboard port (default 8265; when that default is taken
    /// the head starts without a dashboard and says so).
    #[arg(long)]
    pub(crate) dashboard_port: Option<u16>,
    /// The address the dashboard listens on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) dashboard_host: std::net::IpAddr,
    /// Whether the head serves a dashboard.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) include_dashboard: bool,
}

/// An external store for the head's state (Ray's GCS fault tolerance with
/// Redis), for heads whose disk is not kept.
#[derive(Args, Debug, Clone)]
pub(crate) struct RedisArgs {
    /// Keep the head's state in the Redis server at HOST:PORT instead of
    /// the head's disk; its password, if any, from PRISM_REDIS_PASSWORD.
    #[arg(long, env = "PRISM_REDIS_ADDRESS")]
    pub(crate) redis_address: Option<String>,
    /// The prefix of the head's keys in Redis: one cluster per namespace.
    #[arg(
        long,
        env = "PRISM_EXTERNAL_STORAGE_NAMESPACE",
        default_value = "prism"
    )]
    pub(crate) storage_namespace: String,
}

impl RedisArgs {
    /// The Redis place given, if any.
    pub(crate) fn place(&self) -> Option<prism_gcs::RedisPlace> {
        self.redis_address
            .as_ref()
            .map(|address| prism_gcs::RedisPlace {
                address: address.clone(),
                password: std::env::var("PRISM_REDIS_PASSWORD")
                    .ok()
                    .filter(|p| !p.is_empty()),
                namespace: self.storage_namespace.clone(),
            })
    }
}

/// `prism gcs-server`: the head's control store, run by the head node.
#[derive(Args, Debug, Clone)]
pub(crate) struct ControlStoreArgs {
    /// The port to listen on, on every interface.
    #[arg(long)]
    pub(crate) port: u16,
    /// The state file (unless Redis keeps the state).
    #[arg(long, required_unless_present = "redis_address")]
    pub(crate) state: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) redis: RedisArgs,
    #[command(flatten)]
    pub(crate) dashboard: DashboardArgs,
    /// Serve no dashboard, rather than fail, when its port is taken.
    #[arg(long)]
    pub(crate) dashboard_optional: bool,
    /// Where the job table, the jobs' logs and their packages are kept.
    #[arg(long)]
    pub(crate) jobs_dir: PathBuf,
    /// The address of the head node (what a job's driver joins), HOST:PORT.
    #[arg(long)]
    pub(crate) node_ip: String,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
    #[command(flatten)]
    pub(crate) temp: TempDir,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct StatusArgs {
    /// The head, HOST:PORT (default: the cluster of this machine's nodes).
    #[arg(long, env = "PRISM_ADDRESS")]
    pub(crate) address: Option<String>,
    /// The cluster token (default: the one saved on this machine).
    #[arg(long, env = "PRISM_AUTH_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// A file holding the cluster token (wins over --token).
    #[arg(long)]
    pub(crate) token_file: Option<PathBuf>,
    /// TLS files (default: those of this machine's node, if it has any).
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
    /// table (the report, as `ray status` lays it out) or json (every
    /// node with its state, resources and demand, and the autoscaler's
    /// lines, for programs).
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) format: OutputFormat,
    #[command(flatten)]
    pub(crate) temp: TempDir,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct StopArgs {
    /// Kill at once (SIGKILL) instead of asking the nodes to leave.
    #[arg(long)]
    pub(crate) force: bool,
    /// Seconds to wait for a graceful stop before killing.
    #[arg(long, default_value_t = 10)]
    pub(crate) grace_period: u64,
    #[command(flatten)]
    pub(crate) temp: TempDir,
}

/// How `prism list` and `prism summary` print.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputFormat {
    /// An aligned table.
    Table,
    /// JSON.
    Json,
}

/// `prism list`.
#[derive(Args, Debug, Clone)]
pub(crate) struct ListArgs {
    /// What to list: nodes, jobs, actors, tasks, objects, workers or
    /// placement-groups.
    pub(crate) kind: String,
    /// Keep the rows whose field has (key=value) or has not (key!=value)
    /// a value; repeat for more (all must hold). Values compare without
    /// regard to case.
    #[arg(long = "filter", short = 'f')]
    pub(crate) filter: Vec<String>,
    /// At most this many rows (1 to 10,000).
    #[arg(long, default_value_t = prism_state::DEFAULT_LIMIT)]
    pub(crate) limit: usize,
    /// Every field, not only the main ones (tables).
    #[arg(long)]
    pub(crate) detail: bool,
    /// table or json.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) format: OutputFormat,
    #[command(flatten)]
    pub(crate) target: JobTarget,
}

/// `prism get`.
#[derive(Args, Debug, Clone)]
pub(crate) struct GetArgs {
    /// The kind: nodes, jobs, actors, tasks, objects, workers or
    /// placement-groups.
    pub(crate) kind: String,
    /// Its id.
    pub(crate) id: String,
    #[command(flatten)]
    pub(crate) target: JobTarget,
}

/// `prism summary`.
#[derive(Args, Debug, Clone)]
pub(crate) struct SummaryArgs {
    /// tasks, actors or objects.
    pub(crate) kind: String,
    /// table or json.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) format: OutputFormat,
    #[command(flatten)]
    pub(crate) target: JobTarget,
}

/// `prism memory`.
#[derive(Args, Debug, Clone)]
pub(crate) struct MemoryArgs {
    /// At most this many objects (1 to 10,000).
    #[arg(long, default_value_t = prism_state::MAX_LIMIT)]
    pub(crate) limit: usize,
    /// table or json.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) format: OutputFormat,
    #[command(flatten)]
    pub(crate) target: JobTarget,
}

/// `prism timeline`.
#[derive(Args, Debug, Clone)]
pub(crate) struct TimelineArgs {
    /// Only this job's tasks.
    #[arg(long)]
    pub(crate) job: Option<String>,
    /// Where to write the trace (default: prism-timeline-<time>.json here).
    #[arg(short = 'o', long = "output")]
    pub(crate) output: Option<std::path::PathBuf>,
    /// At most this many tasks, the latest (1 to 10,000).
    #[arg(long, default_value_t = prism_state::MAX_LIMIT)]
    pub(crate) limit: usize,
    #[command(flatten)]
    pub(crate) target: JobTarget,
}

/// `prism stack`.
#[derive(Args, Debug, Clone)]
pub(crate) struct StackArgs {
    /// Only this node's workers (its id or address).
    #[arg(long)]
    pub(crate) node: Option<String>,
    /// Only this worker process (with --node, or on the head's node).
    #[arg(long, conflicts_with_all = ["actor", "task"])]
    pub(crate) pid: Option<u32>,
    /// The worker process hosting this actor.
    #[arg(long, conflicts_with_all = ["node", "task"])]
    pub(crate) actor: Option<String>,
    /// The worker process running this task now.
    #[arg(long, conflicts_with = "node")]
    pub(crate) task: Option<String>,
    /// table (text, the default) or json.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) format: OutputFormat,
    #[command(flatten)]
    pub(crate) target: JobTarget,
}

/// `prism logs`.
#[derive(Args, Debug, Clone)]
pub(crate) struct LogsArgs {
    /// A log file's name (as `prism logs` lists them), read on the head
    /// node unless --node names another.
    pub(crate) file: Option<String>,
    /// The node (its id or address) whose files to list or read.
    #[arg(long)]
    pub(crate) node: Option<String>,
    /// An actor's output (of the worker it runs in).
    #[arg(long, conflicts_with_all = ["file", "worker", "job"])]
    pub(crate) actor: Option<String>,
    /// A worker's output.
    #[arg(long, conflicts_with_all = ["file", "job"])]
    pub(crate) worker: Option<String>,
    /// A submitted job's log.
    #[arg(long, conflicts_with = "file")]
    pub(crate) job: Option<String>,
    /// The worker's or actor's standard error instead of its output.
    #[arg(long)]
    pub(crate) err: bool,
    /// Keep printing what is added, until interrupted.
    #[arg(long)]
    pub(crate) follow: bool,
    /// The last lines to print (1 to 100,000).
    #[arg(long, default_value_t = 1000)]
    pub(crate) tail: usize,
    #[command(flatten)]
    pub(crate) target: JobTarget,
}

/// Where `prism job` finds the head.
#[derive(Args, Debug, Clone)]
pub(crate) struct JobTarget {
    /// The head's dashboard, http://HOST:PORT (default: PRISM_ADDRESS when
    /// it is an http:// address, else the head running on this machine).
    /// The token comes from PRISM_AUTH_TOKEN, or the one saved here.
    #[arg(long, global = true)]
    pub(crate) address: Option<String>,
    #[command(flatten)]
    pub(crate) temp: TempDir,
}

/// `prism job`.
#[derive(Args, Debug, Clone)]
pub(crate) struct JobArgs {
    #[command(flatten)]
    pub(crate) target: JobTarget,
    #[command(subcommand)]
    pub(crate) command: JobCommand,
}

/// The `prism job` subcommands (Ray's `ray job`).
#[derive(clap::Subcommand, Debug, Clone)]
pub(crate) enum JobCommand {
    /// Submit a job, follow its log until it ends, and exit 0 only if it
    /// succeeded.
    Submit(SubmitArgs),
    /// A job's status and message.
    Status {
        /// The submission id.
        id: String,
    },
    /// A job's log.
    Logs {
        /// The submission id.
        id: String,
        /// Follow the log until the job ends.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Stop a job (SIGTERM, then SIGKILL after 3 s).
    Stop {
        /// The submission id.
        id: String,
        /// Return without waiting for the job to end.
        #[arg(long)]
        no_wait: bool,
    },
    /// Every job the head keeps, newest first, as JSON.
    List,
    /// Forget an ended job and remove its log.
    Delete {
        /// The submission id.
        id: String,
    },
}

/// `prism job submit`.
#[derive(Args, Debug, Clone)]
pub(crate) struct SubmitArgs {
    /// The id to submit under (default: a new `raysubmit_...` id).
    #[arg(long)]
    pub(crate) submission_id: Option<String>,
    /// A local folder to upload and run the job in (`.git` and `target`
    /// folders are left out).
    #[arg(long)]
    pub(crate) working_dir: Option<PathBuf>,
    /// The runtime environment as JSON (`{"env_vars": {"K": "V"}}`).
    #[arg(long)]
    pub(crate) runtime_env_json: Option<String>,
    /// Labels as a JSON object of strings.
    #[arg(long)]
    pub(crate) metadata_json: Option<String>,
    /// CPUs for the entrypoint.
    #[arg(long)]
    pub(crate) entrypoint_num_cpus: Option<f64>,
    /// GPUs for the entrypoint.
    #[arg(long)]
    pub(crate) entrypoint_num_gpus: Option<f64>,
    /// Memory for the entrypoint, in bytes.
    #[arg(long)]
    pub(crate) entrypoint_memory: Option<u64>,
    /// Custom resources for the entrypoint, as a JSON object of numbers.
    #[arg(long)]
    pub(crate) entrypoint_resources: Option<String>,
    /// Return once submitted, without following the log.
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// The command to run, after `--`.
    #[arg(last = true)]
    pub(crate) entrypoint: Vec<String>,
}

/// `prism up`, `down`, `attach` and `get-head-ip`.
#[derive(Args, Debug, Clone)]
pub(crate) struct LaunchArgs {
    /// The cluster file (YAML, as Ray's cluster launcher reads).
    pub(crate) cluster_file: PathBuf,
}

/// `prism exec`.
#[derive(Args, Debug, Clone)]
pub(crate) struct LaunchExecArgs {
    /// The cluster file.
    pub(crate) cluster_file: PathBuf,
    /// The command to run on the head, after `--`.
    #[arg(last = true)]
    pub(crate) command: Vec<String>,
}

/// `prism submit`.
#[derive(Args, Debug, Clone)]
pub(crate) struct LaunchSubmitArgs {
    /// The cluster file.
    pub(crate) cluster_file: PathBuf,
    /// The driver program to copy to the head and run there as a job.
    pub(crate) program: PathBuf,
    /// The program's arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) args: Vec<String>,
}

/// `prism wait`.
#[derive(Args, Debug, Clone)]
pub(crate) struct WaitArgs {
    /// The cluster of this Slurm allocation (started with `prism start
    /// --slurm`): waits for every node of the allocation.
    #[arg(long)]
    pub(crate) slurm: bool,
    /// Seconds to wait at most.
    #[arg(long, default_value_t = 300)]
    pub(crate) timeout: u64,
}
