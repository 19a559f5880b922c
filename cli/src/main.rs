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

mod args;
#[macro_use]
mod common;
mod control_store;
mod dashboard;
mod discovery;
mod history;
mod jobs;
mod launch;
mod logs;
mod metrics;
mod node;
mod slurm;
mod state;
mod status;
mod stop;

use args::{
    ControlStoreArgs, GetArgs, JobArgs, LaunchArgs, LaunchExecArgs, LaunchSubmitArgs, ListArgs,
    LogsArgs, MemoryArgs, StackArgs, StartArgs, StatusArgs, StopArgs, SummaryArgs, TimelineArgs,
    WaitArgs,
};
use clap::{Parser, Subcommand};
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
    /// Submit jobs to a cluster and follow them (Ray's `ray job`).
    Job(JobArgs),
    /// List the cluster's nodes, jobs, actors, tasks, objects, workers or
    /// placement groups (Ray's `ray list`).
    List(ListArgs),
    /// Show one node, job, actor, task, object, worker or placement group
    /// by its id (Ray's `ray get`).
    Get(GetArgs),
    /// Summarize the cluster's tasks, actors or objects (Ray's
    /// `ray summary`).
    Summary(SummaryArgs),
    /// Read the logs of any node of the cluster: list them, or show a
    /// file, a worker's or an actor's output, or a job's log (Ray's
    /// `ray logs`).
    Logs(LogsArgs),
    /// The objects in the nodes' stores, node by node, with their size,
    /// owner, reference type and location (Ray's `ray memory`).
    Memory(MemoryArgs),
    /// Write the tasks' and actor calls' lives (submitted, running,
    /// ended; per node and worker) in Chrome's trace format, for Perfetto
    /// or chrome://tracing (Ray's `ray timeline`).
    Timeline(TimelineArgs),
    /// Print every thread's stack of the cluster's worker processes (or
    /// of one: --pid, --actor, --task), taken while they run (Ray's
    /// `ray stack`).
    Stack(StackArgs),
    /// Bring up a cluster from a cluster file: the head and its workers
    /// over SSH, with this prism copied to each (Ray's `ray up`). Run
    /// again, it changes only what differs from the file.
    Up(LaunchArgs),
    /// Stop every node of a cluster file's cluster and remove their
    /// session folders (Ray's `ray down`).
    Down(LaunchArgs),
    /// Run a command on a cluster's head, with `prism` on its PATH and
    /// PRISM_ADDRESS set (Ray's `ray exec`).
    Exec(LaunchExecArgs),
    /// Open a shell on a cluster's head (Ray's `ray attach`).
    Attach(LaunchArgs),
    /// Copy a driver program to a cluster's head and run it there as a
    /// job, following its output (Ray's `ray submit`).
    Submit(LaunchSubmitArgs),
    /// Print the address of a cluster's head (Ray's `ray get-head-ip`).
    GetHeadIp(LaunchArgs),
    /// Wait until every node of a cluster has joined (`--slurm`: of this
    /// Slurm allocation), then print the shell lines that point a driver
    /// at it: `eval "$(prism wait --slurm)"`.
    Wait(WaitArgs),
    /// The autoscaler of a cluster file's cluster, as `prism up` runs it
    /// on the head.
    #[command(hide = true)]
    Autoscaler(LaunchArgs),
    /// The head's control store, as `prism start --head` runs it.
    #[command(hide = true)]
    GcsServer(ControlStoreArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Start(args) => node::start(args),
        Command::Status(args) => status::run(args),
        Command::Stop(args) => stop::run(args),
        Command::Job(args) => jobs::run(args),
        Command::List(args) => state::list(args),
        Command::Get(args) => state::get(args),
        Command::Summary(args) => state::summary(args),
        Command::Logs(args) => logs::run(args),
        Command::Memory(args) => state::memory(args),
        Command::Timeline(args) => state::timeline(args),
        Command::Stack(args) => state::stack(args),
        Command::GcsServer(args) => control_store::run(args),
        Command::Up(args) => launch::up(args),
        Command::Down(args) => launch::down(args),
        Command::Exec(args) => launch::exec(args),
        Command::Attach(args) => launch::attach(args),
        Command::Submit(args) => launch::submit(args),
        Command::GetHeadIp(args) => launch::get_head_ip(args),
        Command::Wait(args) => slurm::wait(args),
        Command::Autoscaler(args) => launch::monitor::run(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("prism: {message}");
            ExitCode::FAILURE
        }
    }
}
