//! The node's metrics, in Prometheus's text format with Ray's names where
//! Ray has them: tasks by function and outcome (as their owners on this
//! node report them), actors and workers by state, resources, the object
//! store, spilling and transfers, and the machine's CPU and memory.

use parking_lot::Mutex;
use prism_protocol::exposition::{Exposition, Kind};
use prism_protocol::messages::{
    Latencies, StoreStats, TaskCount, TaskOutcome, LATENCY_BOUNDS_SECONDS,
};
use prism_protocol::resources::ResourceSet;
use std::collections::BTreeMap;

/// Ended tasks, as owners on this node report them: counts, which only
/// grow while the node lives (a worker that exits takes none with it).
#[derive(Debug, Default)]
pub(crate) struct TaskTotals {
    counts: Mutex<BTreeMap<(String, TaskOutcome, bool), u64>>,
    /// Latencies of tasks and of actor calls; attempts made again (tasks,
    /// actor calls); objects rebuilt from their lineage.
    more: Mutex<([Latencies; 2], [u64; 2], u64)>,
}

impl TaskTotals {
    /// Adds an owner's report: its counts, latencies, retries and
    /// rebuilt objects.
    pub(crate) fn add(
        &self,
        counts: Vec<TaskCount>,
        latencies: &[Latencies; 2],
        retries: [u64; 2],
        rebuilt: u64,
    ) {
        {
            let mut all = self.counts.lock();
            for c in counts {
                *all.entry((c.name, c.outcome, c.is_retry)).or_insert(0) += c.count;
            }
        }
        let mut more = self.more.lock();
        for (sum, added) in more.0.iter_mut().zip(latencies) {
            sum.merge(added);
        }
        more.1[0] += retries[0];
        more.1[1] += retries[1];
        more.2 += rebuilt;
    }

    /// The counts, by function, outcome and retry.
    pub(crate) fn snapshot(&self) -> Vec<((String, TaskOutcome, bool), u64)> {
        self.counts
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}

/// What the node's tables hold now, read under their locks by the caller.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    pub(crate) total: ResourceSet,
    pub(crate) available: ResourceSet,
    /// Actors by (Ray's state name, class).
    pub(crate) actors: BTreeMap<(&'static str, String), u64>,
    /// Worker processes by state (`IDLE`, `LEASED`, `ACTOR`, `STARTING`,
    /// `STOPPING`).
    pub(crate) workers: BTreeMap<&'static str, u64>,
    /// Lease requests waiting for resources.
    pub(crate) waiting_leases: u64,
    /// Tasks and actor calls running now, by function.
    pub(crate) running_tasks: BTreeMap<String, u64>,
    /// Tasks waiting for a worker in their owners' queues, by function.
    pub(crate) pending_tasks: BTreeMap<String, u64>,
    /// How long granted lease requests waited.
    pub(crate) lease_waits: Latencies,
    /// The machine's GPUs (read only on a node that offers GPUs).
    pub(crate) gpus: Vec<crate::gpus::GpuSample>,
}

/// One histogram of times over [`LATENCY_BOUNDS_SECONDS`].
fn histogram(out: &mut Exposition, name: &str, labels: &[(&str, &str)], times: &Latencies) {
    let mut counts = times.counts.clone();
    counts.resize(LATENCY_BOUNDS_SECONDS.len() + 1, 0);
    out.histogram(
        name,
        labels,
        LATENCY_BOUNDS_SECONDS,
        &counts,
        times.sum_us as f64 / 1e6,
    );
}

/// The machine's CPU use, from `/proc/stat` between two scrapes.
#[derive(Debug, Default)]
pub(crate) struct CpuSampler {
    last: Mutex<Option<(u64, u64)>>,
}

impl CpuSampler {
    /// Percent of the machine's CPU time spent busy since the last call
    /// (since boot on the first).
    fn utilization(&self) -> Option<f64> {
        let (busy, all) = read_cpu()?;
        let mut last = self.last.lock();
        let (busy0, all0) = last.replace((busy, all)).unwrap_or((0, 0));
        let d_all = all.saturating_sub(all0);
        (d_all > 0).then(|| 100.0 * busy.saturating_sub(busy0) as f64 / d_all as f64)
    }
}

/// Busy and total jiffies of all CPUs.
fn read_cpu() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let all: u64 = fields.iter().take(8).sum();
    // idle and iowait are not busy.
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((all.saturating_sub(idle), all))
}

/// Total and available memory of the machine, in bytes.
fn read_memory() -> Option<(u64, u64)> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// Everything the node knows, as its `/metrics` answer.
pub(crate) fn render(
    session: &str,
    node_ip: &str,
    tables: &Tables,
    store: &StoreStats,
    tasks: &TaskTotals,
    cpu: &CpuSampler,
) -> String {
    let mut out = Exposition::new(session);
    out.family(
        "ray_tasks",
        Kind::Gauge,
        "Tasks and actor calls that ended, by function, state and whether it was a retry \
         (owners on this node report them about once a second).",
    );
    for ((name, outcome, retry), count) in tasks.snapshot() {
        out.sample(
            "ray_tasks",
            &[
                ("Name", &name),
                ("State", outcome.ray_state()),
                ("IsRetry", if retry { "1" } else { "0" }),
            ],
            count as f64,
        );
    }
    for (state, counts) in [
        ("RUNNING", &tables.running_tasks),
        ("PENDING_NODE_ASSIGNMENT", &tables.pending_tasks),
    ] {
        for (name, count) in counts {
            out.sample(
                "ray_tasks",
                &[("Name", name), ("State", state), ("IsRetry", "0")],
                *count as f64,
            );
        }
    }
    let (latencies, retries, rebuilt) = tasks.more.lock().clone();
    out.family(
        "prism_task_latency_seconds",
        Kind::Histogram,
        "Time from a task's submission to its owner's learning of its result, tasks and \
         actor calls apart (owners on this node report them).",
    );
    for (kind, latency) in ["NORMAL_TASK", "ACTOR_TASK"].iter().zip(&latencies) {
        histogram(
            &mut out,
            "prism_task_latency_seconds",
            &[("Type", kind)],
            latency,
        );
    }
    out.family(
        "prism_task_retries_total",
        Kind::Counter,
        "Attempts made again by owners on this node: tasks after a failure, actor calls \
         sent again to a restarted actor.",
    );
    for (kind, count) in ["NORMAL_TASK", "ACTOR_TASK"].iter().zip(retries) {
        out.sample("prism_task_retries_total", &[("Type", kind)], count as f64);
    }
    out.family(
        "prism_lease_wait_seconds",
        Kind::Histogram,
        "How long the lease requests granted on this node waited for a worker and \
         resources, from their arrival to their grant.",
    );
    histogram(
        &mut out,
        "prism_lease_wait_seconds",
        &[],
        &tables.lease_waits,
    );
    out.single(
        "prism_objects_rebuilt_total",
        Kind::Counter,
        "Objects made again from their lineage by owners on this node (their copies were \
         lost with a node).",
        rebuilt as f64,
    );
    out.family(
        "ray_actors",
        Kind::Gauge,
        "Actors this node's table holds, by class and state.",
    );
    for ((state, class), count) in &tables.actors {
        out.sample(
            "ray_actors",
            &[("Name", class), ("State", state)],
            *count as f64,
        );
    }
    out.family(
        "ray_resources",
        Kind::Gauge,
        "The node's logical resources, by name and state (AVAILABLE or USED).",
    );
    for (name, total) in tables.total.iter() {
        let available = tables.available.get(name).as_f64();
        let total = total.as_f64();
        out.sample(
            "ray_resources",
            &[
                ("Name", name),
                ("State", "AVAILABLE"),
                ("NodeAddress", node_ip),
            ],
            available,
        );
        out.sample(
            "ray_resources",
            &[("Name", name), ("State", "USED"), ("NodeAddress", node_ip)],
            (total - available).max(0.0),
        );
    }
    out.family(
        "ray_object_store_memory",
        Kind::Gauge,
        "Bytes of objects in the node's store, by location (MMAP_SHM: in shared memory).",
    );
    out.sample(
        "ray_object_store_memory",
        &[("Location", "MMAP_SHM"), ("NodeAddress", node_ip)],
        store.used_bytes as f64,
    );
    out.single(
        "ray_object_store_available_memory",
        Kind::Gauge,
        "Bytes free in the node's object store.",
        store.capacity_bytes.saturating_sub(store.used_bytes) as f64,
    );
    out.single(
        "ray_object_store_num_local_objects",
        Kind::Gauge,
        "Objects in the node's store.",
        store.num_objects as f64,
    );
    out.family(
        "prism_workers",
        Kind::Gauge,
        "Worker processes of the node, by state.",
    );
    for (state, count) in &tables.workers {
        out.sample("prism_workers", &[("State", state)], *count as f64);
    }
    out.single(
        "prism_lease_requests_waiting",
        Kind::Gauge,
        "Worker lease requests waiting for resources on this node.",
        tables.waiting_leases as f64,
    );
    let counters = [
        (
            "prism_object_store_spilled_bytes_total",
            "Bytes of objects written to spill files since the node started.",
            store.spilled_bytes_total,
        ),
        (
            "prism_object_store_restored_bytes_total",
            "Bytes of objects read back from spill files since the node started.",
            store.restored_bytes_total,
        ),
        (
            "prism_object_store_pulled_bytes_total",
            "Bytes of objects pulled from other nodes' stores since the node started.",
            store.pulled_bytes_total,
        ),
        (
            "prism_object_store_served_bytes_total",
            "Bytes of objects served to other nodes since the node started.",
            store.served_bytes_total,
        ),
    ];
    for (name, help, value) in counters {
        out.single(name, Kind::Counter, help, value as f64);
    }
    if let Some(percent) = cpu.utilization() {
        out.single(
            "ray_node_cpu_utilization",
            Kind::Gauge,
            "Percent of the machine's CPU time spent busy since the last scrape.",
            percent,
        );
    }
    out.single(
        "ray_node_cpu_count",
        Kind::Gauge,
        "CPUs of the machine.",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as f64,
    );
    if !tables.gpus.is_empty() {
        let gpu_labels = |g: &crate::gpus::GpuSample| {
            [
                ("GpuIndex", g.index.clone()),
                ("GpuDeviceName", g.name.clone()),
                ("ip", node_ip.to_string()),
            ]
        };
        type Read = fn(&crate::gpus::GpuSample) -> f64;
        let families: [(&str, &str, Read); 3] = [
            (
                "ray_node_gpus_utilization",
                "Percent of the last sample period each GPU was busy (nvidia-smi).",
                |g| g.utilization,
            ),
            (
                "ray_node_gram_used",
                "Bytes of each GPU's memory in use (nvidia-smi).",
                |g| g.memory_used_bytes as f64,
            ),
            (
                "ray_node_gram_available",
                "Bytes of each GPU's memory free (nvidia-smi).",
                |g| g.memory_total_bytes.saturating_sub(g.memory_used_bytes) as f64,
            ),
        ];
        for (name, help, value) in families {
            out.family(name, Kind::Gauge, help);
            for g in &tables.gpus {
                let labels = gpu_labels(g);
                let labels: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                out.sample(name, &labels, value(g));
            }
        }
        out.single(
            "ray_node_gpus_available",
            Kind::Gauge,
            "GPUs of the machine (nvidia-smi).",
            tables.gpus.len() as f64,
        );
    }
    if let Some((total, available)) = read_memory() {
        out.single(
            "ray_node_mem_used",
            Kind::Gauge,
            "Bytes of the machine's memory in use (total less available).",
            total.saturating_sub(available) as f64,
        );
        out.single(
            "ray_node_mem_total",
            Kind::Gauge,
            "Bytes of memory of the machine.",
            total as f64,
        );
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_add_up_and_render_with_rays_names() {
        let totals = TaskTotals::default();
        let report = |n, outcome, count| TaskCount {
            name: n,
            outcome,
            is_retry: false,
            count,
        };
        let mut quick = Latencies::default();
        quick.observe(700);
        quick.observe(3_000_000);
        let none = [Latencies::default(), Latencies::default()];
        totals.add(
            vec![report("add".into(), TaskOutcome::Finished, 3)],
            &[quick, Latencies::default()],
            [2, 0],
            1,
        );
        totals.add(
            vec![
                report("add".into(), TaskOutcome::Finished, 2),
                report("boom".into(), TaskOutcome::Failed, 1),
            ],
            &none,
            [1, 1],
            0,
        );
        let mut tables = Tables::default();
        tables.total.set(
            "CPU",
            prism_protocol::resources::Quantity::from_f64("CPU", 2.0).unwrap(),
        );
        tables.available.set(
            "CPU",
            prism_protocol::resources::Quantity::from_f64("CPU", 0.5).unwrap(),
        );
        tables.actors.insert(("ALIVE", "Counter".into()), 2);
        tables.running_tasks.insert("slow".into(), 1);
        tables.lease_waits.observe(20_000);
        tables.gpus.push(crate::gpus::GpuSample {
            index: "0".into(),
            name: "NVIDIA H100".into(),
            utilization: 87.0,
            memory_used_bytes: 1 << 30,
            memory_total_bytes: 4 << 30,
        });
        let store = StoreStats {
            used_bytes: 10,
            capacity_bytes: 100,
            num_objects: 1,
            num_pinned: 0,
            num_spilled: 0,
            spilled_total: 0,
            spilled_bytes_total: 0,
            restored_total: 0,
            restored_bytes_total: 0,
            spill_write_nanos: 0,
            restore_read_nanos: 0,
            pulled_bytes_total: 0,
            served_bytes_total: 0,
        };
        let text = render(
            "s",
            "10.0.0.1",
            &tables,
            &store,
            &totals,
            &CpuSampler::default(),
        );
        for line in [
            "ray_tasks{SessionName=\"s\",Name=\"add\",State=\"FINISHED\",IsRetry=\"0\"} 5",
            "ray_tasks{SessionName=\"s\",Name=\"boom\",State=\"FAILED\",IsRetry=\"0\"} 1",
            "ray_tasks{SessionName=\"s\",Name=\"slow\",State=\"RUNNING\",IsRetry=\"0\"} 1",
            "ray_actors{SessionName=\"s\",Name=\"Counter\",State=\"ALIVE\"} 2",
            "ray_resources{SessionName=\"s\",Name=\"CPU\",State=\"USED\",NodeAddress=\"10.0.0.1\"} 1.5",
            "ray_object_store_available_memory{SessionName=\"s\"} 90",
            "prism_task_latency_seconds_bucket{SessionName=\"s\",Type=\"NORMAL_TASK\",le=\"0.0005\"} 0",
            "prism_task_latency_seconds_bucket{SessionName=\"s\",Type=\"NORMAL_TASK\",le=\"0.001\"} 1",
            "prism_task_latency_seconds_bucket{SessionName=\"s\",Type=\"NORMAL_TASK\",le=\"+Inf\"} 2",
            "prism_task_latency_seconds_sum{SessionName=\"s\",Type=\"NORMAL_TASK\"} 3.0007",
            "prism_task_latency_seconds_count{SessionName=\"s\",Type=\"ACTOR_TASK\"} 0",
            "prism_task_retries_total{SessionName=\"s\",Type=\"NORMAL_TASK\"} 3",
            "prism_objects_rebuilt_total{SessionName=\"s\"} 1",
            "prism_lease_wait_seconds_bucket{SessionName=\"s\",le=\"0.01\"} 0",
            "prism_lease_wait_seconds_bucket{SessionName=\"s\",le=\"0.025\"} 1",
            "prism_lease_wait_seconds_count{SessionName=\"s\"} 1",
            "ray_node_gpus_utilization{SessionName=\"s\",GpuIndex=\"0\",GpuDeviceName=\"NVIDIA H100\",ip=\"10.0.0.1\"} 87",
            "ray_node_gram_available{SessionName=\"s\",GpuIndex=\"0\",GpuDeviceName=\"NVIDIA H100\",ip=\"10.0.0.1\"} 3221225472",
            "ray_node_gpus_available{SessionName=\"s\"} 1",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }
}
