//! The worker actor: one per training worker process.

use super::checkpoint::Checkpoint;
use super::context::{install, ClusterKv, Device, TrainContext, WorkerEvent, WorkerState};
use crate::collective::{GroupOptions, GroupTls, KvRendezvous, ProcessGroup};
use crate::data::DataIterator;
use crate::portable::PortableFn;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

/// The type-erased entry every training function is called through: it
/// resolves the user's function, decodes the config and runs it.
pub(crate) type Entry = fn(Vec<u8>, Vec<u8>) -> Result<(), String>;

/// What the driver tells a worker before it starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WorkerSetup {
    pub(crate) context: TrainContext,
    pub(crate) group_name: String,
    pub(crate) checkpoint: Option<Checkpoint>,
    pub(crate) start_iteration: u64,
    pub(crate) datasets: BTreeMap<String, DataIterator>,
}

/// Where a worker runs, for rank assignment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WorkerPlace {
    pub(crate) node: String,
    pub(crate) pid: u32,
    pub(crate) gpu_ids: Vec<u32>,
}

/// One training worker.
#[prism::actor]
pub(crate) struct PrismTrainWorker {
    events: Option<Mutex<Receiver<WorkerEvent>>>,
    state: Option<Arc<WorkerState>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[prism::actor]
impl PrismTrainWorker {
    fn new() -> Self {
        PrismTrainWorker {
            events: None,
            state: None,
            thread: Mutex::new(None),
        }
    }

    /// Where this worker runs.
    fn place(&self) -> Result<WorkerPlace, String> {
        let ctx = prism::runtime_context().map_err(|e| e.to_string())?;
        Ok(WorkerPlace {
            node: ctx.node_id.to_string(),
            pid: std::process::id(),
            gpu_ids: ctx.gpu_ids,
        })
    }

    /// Joins the run's collective group and installs the context.
    fn setup(&mut self, setup: WorkerSetup) -> Result<(), String> {
        let ctx = &setup.context;
        let mut options = GroupOptions::new(ctx.world_rank, ctx.world_size, "cluster-kv")
            .group_name(setup.group_name.clone());
        // In a cluster with TLS, links between nodes are encrypted too.
        if let Some(tls) = prism::node_tls() {
            options = options.tls(GroupTls::new(tls.client_config(), tls.server_config()));
        }
        // Peers on other nodes reach this worker at its node's address.
        let ip = prism::runtime_context()
            .ok()
            .and_then(|c| c.node_ip)
            .and_then(|ip| ip.parse().ok())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let rendezvous = KvRendezvous::new(ClusterKv, ip);
        let group = ProcessGroup::join_with(options, &rendezvous).map_err(|e| e.to_string())?;
        let (tx, rx) = sync_channel(0);
        let state = Arc::new(WorkerState {
            context: setup.context,
            group: Arc::new(group),
            checkpoint: setup.checkpoint,
            datasets: setup.datasets,
            next_iteration: Mutex::new(setup.start_iteration),
            events: tx,
        });
        install(state.clone());
        self.state = Some(state);
        self.events = Some(Mutex::new(rx));
        Ok(())
    }

    /// Starts the training function on a thread of its own.
    fn start(
        &mut self,
        entry: PortableFn<Entry>,
        function: Vec<u8>,
        config: Vec<u8>,
    ) -> Result<(), String> {
        // SAFETY: the token was made by PortableFn::new in Trainer::new.
        let entry = unsafe { entry.resolve() }.map_err(|e| e.to_string())?;
        let Some(state) = self.state.clone() else {
            return Err("start before setup".into());
        };
        let handle = std::thread::Builder::new()
            .name("train-loop".into())
            .spawn(move || {
                let outcome = std::panic::catch_unwind(|| entry(function, config));
                let event = match outcome {
                    Ok(Ok(())) => WorkerEvent::Finished,
                    Ok(Err(message)) => WorkerEvent::Failed { message },
                    Err(panic) => WorkerEvent::Failed {
                        message: format!("panicked: {}", panic_text(&panic)),
                    },
                };
                let _ = state.events.send(event);
            })
            .map_err(|e| format!("could not start the training thread: {e}"))?;
        *self.thread.lock() = Some(handle);
        Ok(())
    }

    /// The next report, or the end of the training function.
    fn next_event(&self) -> Result<WorkerEvent, String> {
        let Some(rx) = &self.events else {
            return Err("next_event before setup".into());
        };
        rx.lock()
            .recv()
            .map_err(|_| "the training thread ended without a word".to_string())
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".into())
}

/// The device a worker with these GPUs trains on.
pub(crate) fn device_for(use_gpu: bool) -> Device {
    if use_gpu {
        Device::Cuda(0)
    } else {
        Device::Cpu
    }
}
