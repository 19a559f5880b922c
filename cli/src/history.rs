//! The head's short history of the cluster, for the dashboard's charts
//! (so that a user sees them without installing Prometheus or Grafana):
//! every 2 s, the live nodes' resources in use, the nodes alive, and the
//! tasks finished and failed; the last 10 minutes kept.

use prism_gcs::pb::NodeState;
use prism_gcs::GcsView;
use prism_state::{Kind, StateApi};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

/// How often a sample is taken.
const PERIOD: Duration = Duration::from_secs(2);
/// Samples kept: 10 minutes.
const KEPT: usize = 300;

/// The samples, each series aligned with `times`.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: Mutex<Samples>,
}

#[derive(Debug, Default)]
struct Samples {
    times: VecDeque<u64>,
    series: BTreeMap<String, VecDeque<f64>>,
}

impl History {
    fn record(&self, at_ms: u64, values: BTreeMap<String, f64>) {
        let mut s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let before = s.times.len();
        for (name, _) in values.iter() {
            s.series
                .entry(name.clone())
                .or_insert_with(|| std::iter::repeat_n(0.0, before).collect());
        }
        for (name, series) in s.series.iter_mut() {
            series.push_back(values.get(name).copied().unwrap_or(0.0));
            if series.len() > KEPT {
                series.pop_front();
            }
        }
        s.times.push_back(at_ms);
        if s.times.len() > KEPT {
            s.times.pop_front();
        }
    }

    /// `{times: [unix ms], series: [{name, values}]}`.
    pub(crate) fn json(&self) -> Value {
        let s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        json!({
            "times": s.times,
            "series": s.series.iter().map(|(name, values)| json!({"name": name, "values": values})).collect::<Vec<_>>(),
        })
    }
}

/// One sample of the cluster.
async fn sample(gcs: &GcsView, state: Option<&StateApi>) -> BTreeMap<String, f64> {
    let mut values = BTreeMap::new();
    let nodes = gcs.nodes();
    let alive: Vec<_> = nodes
        .iter()
        .filter(|n| n.state == NodeState::Alive as i32)
        .collect();
    values.insert("nodes alive".to_string(), alive.len() as f64);
    for n in &alive {
        for r in &n.total {
            let free = n
                .available
                .iter()
                .find(|a| a.name == r.name)
                .map(|a| a.units)
                .unwrap_or(0);
            *values.entry(format!("{} used", r.name)).or_insert(0.0) +=
                r.units.saturating_sub(free) as f64 / 10_000.0;
        }
    }
    if let Some(state) = state {
        if let Ok(summary) = state.summarize(Kind::Tasks).await {
            let (mut finished, mut failed) = (0.0, 0.0);
            for group in summary["summary"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values())
            {
                finished += group["state_counts"]["FINISHED"].as_f64().unwrap_or(0.0);
                failed += group["state_counts"]["FAILED"].as_f64().unwrap_or(0.0);
            }
            values.insert("tasks finished".into(), finished);
            values.insert("tasks failed".into(), failed);
        }
    }
    values
}

/// Samples every 2 s until the task is aborted.
pub(crate) fn start(
    gcs: GcsView,
    state: Option<Arc<StateApi>>,
) -> (Arc<History>, tokio::task::JoinHandle<()>) {
    let history = Arc::new(History::default());
    let kept = history.clone();
    let task = tokio::spawn(async move {
        for round in 0u64.. {
            // The actors of a node that dies later are listed dead from
            // what it last listed.
            if let (Some(state), 0) = (&state, round % 5) {
                state.remember_actors().await;
            }
            let values = sample(&gcs, state.as_deref()).await;
            kept.record(prism_protocol::clock::unix_ms(), values);
            tokio::time::sleep(PERIOD).await;
        }
    });
    (history, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_stay_aligned_and_bounded() {
        let h = History::default();
        h.record(1, BTreeMap::from([("a".to_string(), 1.0)]));
        h.record(2, BTreeMap::from([("b".to_string(), 5.0)]));
        let j = h.json();
        assert_eq!(j["times"], json!([1, 2]));
        assert_eq!(j["series"][0], json!({"name": "a", "values": [1.0, 0.0]}));
        assert_eq!(j["series"][1], json!({"name": "b", "values": [0.0, 5.0]}));
        for t in 0..(KEPT as u64 + 10) {
            h.record(t, BTreeMap::new());
        }
        let j = h.json();
        assert_eq!(j["times"].as_array().map(|a| a.len()), Some(KEPT));
        assert_eq!(
            j["series"][0]["values"].as_array().map(|a| a.len()),
            Some(KEPT)
        );
    }
}
