//! Counts of the tasks and actor calls this process owned that ended, by
//! function, outcome and retry, sent to the node's raylet about once a
//! second (and when the process stops) for the node's metrics.

use parking_lot::Mutex;
use prism_protocol::messages::{ReportTaskCounts, TaskCount, TaskOutcome};
use prism_protocol::rpc::Connection;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Counts not yet reported: per function, `[finished, failed]` for first
/// attempts and for retries.
#[derive(Debug, Default)]
pub(crate) struct TaskCounts {
    unreported: Mutex<HashMap<String, [u64; 4]>>,
}

fn slot(outcome: TaskOutcome, is_retry: bool) -> usize {
    (outcome == TaskOutcome::Failed) as usize + 2 * is_retry as usize
}

impl TaskCounts {
    /// Counts one ended task (no allocation once the function was seen).
    pub(crate) fn record(&self, function: &str, outcome: TaskOutcome, is_retry: bool) {
        let mut all = self.unreported.lock();
        let i = slot(outcome, is_retry);
        match all.get_mut(function) {
            Some(counts) => counts[i] += 1,
            None => {
                let mut counts = [0; 4];
                counts[i] = 1;
                all.insert(function.to_string(), counts);
            }
        }
    }

    /// Everything counted since the last call.
    fn take(&self) -> Vec<TaskCount> {
        let all = std::mem::take(&mut *self.unreported.lock());
        let mut out = Vec::new();
        for (name, counts) in all {
            for (outcome, is_retry) in [
                (TaskOutcome::Finished, false),
                (TaskOutcome::Failed, false),
                (TaskOutcome::Finished, true),
                (TaskOutcome::Failed, true),
            ] {
                let count = counts[slot(outcome, is_retry)];
                if count > 0 {
                    out.push(TaskCount {
                        name: name.clone(),
                        outcome,
                        is_retry,
                        count,
                    });
                }
            }
        }
        out
    }

    /// Sends what was counted to the raylet; kept for the next try when
    /// it cannot be sent.
    pub(crate) async fn report(&self, raylet: &Connection) {
        let counts = self.take();
        if counts.is_empty() {
            return;
        }
        if let Err(e) = raylet
            .request(ReportTaskCounts {
                counts: counts.clone(),
            })
            .await
        {
            tracing::debug!(error = %e, "task counts not reported; kept for the next report");
            let mut all = self.unreported.lock();
            for c in counts {
                let entry = all.entry(c.name).or_insert([0; 4]);
                entry[slot(c.outcome, c.is_retry)] += c.count;
            }
        }
    }

    /// Reports every `period` until the connection closes.
    pub(crate) fn start_reporting(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
        raylet: Connection,
        period: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        rt.spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if raylet.is_closed() {
                    return;
                }
                this.report(&raylet).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_once_by_function_outcome_and_retry() {
        let counts = TaskCounts::default();
        for _ in 0..3 {
            counts.record("add", TaskOutcome::Finished, false);
        }
        counts.record("add", TaskOutcome::Failed, true);
        counts.record("boom", TaskOutcome::Failed, false);
        let mut taken = counts.take();
        taken.sort_by(|a, b| (&a.name, a.outcome).cmp(&(&b.name, b.outcome)));
        let short: Vec<(&str, TaskOutcome, bool, u64)> = taken
            .iter()
            .map(|c| (c.name.as_str(), c.outcome, c.is_retry, c.count))
            .collect();
        assert_eq!(
            short,
            vec![
                ("add", TaskOutcome::Finished, false, 3),
                ("add", TaskOutcome::Failed, true, 1),
                ("boom", TaskOutcome::Failed, false, 1),
            ]
        );
        assert!(counts.take().is_empty());
    }
}
