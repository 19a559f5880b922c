//! The drivers of a cluster, recorded in the head's key-value table as
//! they register with this node's raylet and as they leave, so that the
//! head's job list shows drivers started by hand (Ray's jobs of type
//! DRIVER) and links a submitted job to its driver's job id.

use crate::membership::Membership;
use prism_protocol::ids::JobId;
use prism_protocol::messages::{DriverRecord, DRIVER_RECORD_PREFIX};

/// A driver's record, kept by its connection until it closes.
#[derive(Debug, Clone)]
pub(crate) struct DriverEntry {
    record: DriverRecord,
}

impl DriverEntry {
    /// Records a driver that registered (in the background: registration
    /// does not wait for the head).
    pub(crate) fn started(
        membership: &Membership,
        job: JobId,
        pid: u32,
        submission_id: Option<String>,
    ) -> DriverEntry {
        let (node_id, node_ip) = membership.node();
        let record = DriverRecord {
            job_id: job.to_string(),
            submission_id,
            pid,
            node_id: node_id.to_string(),
            node_ip: node_ip.to_string(),
            entrypoint: command_line(pid),
            start_time: prism_protocol::clock::unix_ms(),
            end_time: None,
        };
        put(membership, &record);
        DriverEntry { record }
    }

    /// Records that the driver's connection closed.
    pub(crate) fn ended(mut self, membership: &Membership) {
        self.record.end_time = Some(prism_protocol::clock::unix_ms());
        put(membership, &self.record);
    }
}

fn put(membership: &Membership, record: &DriverRecord) {
    let Ok(value) = serde_json::to_vec(record) else {
        return;
    };
    let key = format!("{DRIVER_RECORD_PREFIX}{}", record.job_id);
    let mut gcs = membership.gcs();
    tokio::spawn(async move {
        if let Err(e) = gcs.kv_put(key, value, true).await {
            tracing::warn!(error = %e, "could not record a driver in the head's job list");
        }
    });
}

/// A process's command line, its arguments joined by spaces (empty if it
/// cannot be read).
fn command_line(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}
