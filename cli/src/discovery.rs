//! Prometheus's file-based service discovery: the head writes
//! `<temp dir>/prom_metrics_service_discovery.json` (Ray's name), listing
//! the metrics endpoint of every live node and the head's dashboard, and
//! writes it again (whole, by renaming a new file over it) whenever that
//! list changes. A Prometheus whose `file_sd_configs` names the file
//! scrapes the cluster as nodes come and go.

use prism_gcs::pb::NodeState;
use prism_gcs::GcsView;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The file's name in the head's temp folder.
pub(crate) const FILE_NAME: &str = "prom_metrics_service_discovery.json";

/// How often the node table is looked at.
const PERIOD: Duration = Duration::from_secs(2);

/// The file's content: one target group for the nodes, one for the head's
/// dashboard (cluster-wide gauges).
fn content(view: &GcsView, dashboard: Option<&str>) -> String {
    let mut nodes: Vec<String> = view
        .nodes()
        .into_iter()
        .filter(|n| n.state == NodeState::Alive as i32 && !n.metrics_address.is_empty())
        .map(|n| n.metrics_address)
        .collect();
    nodes.sort();
    let mut groups =
        vec![json!({"labels": {"job": "prism", "prism_component": "node"}, "targets": nodes})];
    if let Some(at) = dashboard {
        groups
            .push(json!({"labels": {"job": "prism", "prism_component": "head"}, "targets": [at]}));
    }
    serde_json::Value::Array(groups).to_string()
}

/// Writes `text` to `path` whole: a reader sees the old file or the new.
fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let partial = path.with_extension("json.partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

/// Keeps the file current until the task is aborted (and removes it
/// then, through [`Writer`]'s drop).
pub(crate) struct Writer {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Starts keeping `<temp dir>/prom_metrics_service_discovery.json`.
pub(crate) fn start(view: GcsView, temp_dir: &Path, dashboard: Option<String>) -> Writer {
    let path = temp_dir.join(FILE_NAME);
    let target = path.clone();
    let task = tokio::spawn(async move {
        let mut written = String::new();
        loop {
            let text = content(&view, dashboard.as_deref());
            if text != written {
                match write_whole(&target, &text) {
                    Ok(()) => written = text,
                    Err(e) => {
                        tracing::warn!(path = %target.display(), error = %e, "cannot write the metrics discovery file")
                    }
                }
            }
            tokio::time::sleep(PERIOD).await;
        }
    });
    Writer { path, task }
}
