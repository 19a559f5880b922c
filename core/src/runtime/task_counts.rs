//! The tasks and actor calls this process owned that ended: counts by
//! function, outcome and retry (for the node's metrics) and one event per
//! task (for `prism list tasks`), sent to the node's raylet about once a
//! second and when the process stops, with what the process ran itself
//! (`task_runs`).

use super::task_runs::TaskRuns;
use parking_lot::Mutex;
use prism_protocol::ids::TaskId;
use prism_protocol::messages::{
    Latencies, PendingTask, ReportTaskCounts, TaskCount, TaskEvent, TaskOutcome,
};
use prism_protocol::rpc::Connection;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Finished tasks kept between two reports (the newest); beyond them the
/// oldest are dropped and counted, and the counts stay exact. A node keeps
/// 10,000 by default, so a busy owner sending every task it ran (tens of
/// thousands a second) would spend its time describing tasks the node
/// drops at once.
const FINISHED_KEPT: usize = 1_000;
/// Failed tasks kept between two reports: all of them, up to this.
const FAILED_KEPT: usize = 10_000;
/// Waiting tasks reported at most (the oldest).
const PENDING_SENT: usize = 1_000;

/// The tasks this process owns that wait for a worker, the oldest first,
/// at most the count given: id, function, submission time. Handed in by
/// the composition root (the submitter's queues are above this file).
pub(crate) type Waiting = Box<dyn Fn(usize) -> Vec<(TaskId, String, u64)> + Send + Sync>;

/// What was not reported yet.
#[derive(Debug, Default)]
struct Unreported {
    /// Per function, `[finished, failed]` for first attempts, then for
    /// retries.
    counts: HashMap<String, [u64; 4]>,
    finished: std::collections::VecDeque<Ended>,
    failed: std::collections::VecDeque<Ended>,
    dropped: u64,
    /// Latencies of tasks, then of actor calls.
    latencies: [Latencies; 2],
}

impl Unreported {
    /// Keeps an ended task, dropping (and counting) the oldest of its
    /// outcome beyond the bound.
    fn keep(&mut self, event: Ended) {
        let (events, bound) = match event.outcome {
            TaskOutcome::Finished => (&mut self.finished, FINISHED_KEPT),
            TaskOutcome::Failed => (&mut self.failed, FAILED_KEPT),
        };
        if events.len() >= bound {
            events.pop_front();
            self.dropped += 1;
        }
        events.push_back(event);
    }
}

/// A task that ended, as recorded: its id is written out only when it is
/// reported, off the task's path.
#[derive(Debug)]
struct Ended {
    task_id: TaskId,
    name: String,
    outcome: TaskOutcome,
    retries: u32,
    error: Option<String>,
    submitted_us: u64,
    returned_us: u64,
}

/// Ended tasks not yet reported.
pub(crate) struct TaskCounts {
    unreported: Mutex<Unreported>,
    /// This process's job, named in each event.
    job_id: String,
    /// Whether anything is recorded (`task_events_report_interval_ms`
    /// above 0).
    enabled: bool,
    /// This process's retries (tasks, actor calls) and rebuilt objects
    /// as of the last report.
    reported_totals: Mutex<([u64; 2], u64)>,
    /// Where the waiting tasks are read (the task submitter's queues).
    waiting: Waiting,
    /// The last report listed waiting tasks.
    waiting_sent: Mutex<bool>,
}

impl std::fmt::Debug for TaskCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskCounts")
            .field("job_id", &self.job_id)
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

fn slot(outcome: TaskOutcome, is_retry: bool) -> usize {
    (outcome == TaskOutcome::Failed) as usize + 2 * is_retry as usize
}

impl TaskCounts {
    /// Counts of the tasks of a process of `job_id`, whose waiting tasks
    /// `waiting` lists; nothing is recorded unless `enabled`.
    pub(crate) fn new(job_id: String, enabled: bool, waiting: Waiting) -> TaskCounts {
        TaskCounts {
            unreported: Mutex::default(),
            job_id,
            enabled,
            reported_totals: Mutex::default(),
            waiting,
            waiting_sent: Mutex::new(false),
        }
    }

    /// The waiting tasks, when they are to be sent: some now, or none now
    /// after some were.
    fn pending(&self) -> Option<Vec<PendingTask>> {
        let now: Vec<PendingTask> = (self.waiting)(PENDING_SENT)
            .into_iter()
            .map(|(id, name, submitted_us)| PendingTask {
                task_id: id.to_string(),
                name,
                job_id: self.job_id.clone(),
                submitted_us,
            })
            .collect();
        let mut sent = self.waiting_sent.lock();
        let before = std::mem::replace(&mut *sent, !now.is_empty());
        (before || !now.is_empty()).then_some(now)
    }

    /// Records one ended task (an actor call if `actor_call`), submitted
    /// at `submitted_us`: its count, its latency and its event.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        task_id: TaskId,
        function: &str,
        actor_call: bool,
        submitted_us: u64,
        outcome: TaskOutcome,
        retries: u32,
        error: Option<String>,
    ) {
        if !self.enabled {
            return;
        }
        let event = Ended {
            task_id,
            name: function.to_string(),
            outcome,
            retries,
            error,
            submitted_us,
            returned_us: prism_protocol::clock::unix_us(),
        };
        let latency = event.returned_us.saturating_sub(submitted_us);
        let mut unreported = self.unreported.lock();
        if submitted_us > 0 {
            unreported.latencies[actor_call as usize].observe(latency);
        }
        unreported.keep(event);
        let all = &mut unreported.counts;
        let i = slot(outcome, retries > 0);
        match all.get_mut(function) {
            Some(counts) => counts[i] += 1,
            None => {
                let mut counts = [0; 4];
                counts[i] = 1;
                all.insert(function.to_string(), counts);
            }
        }
    }

    /// Everything recorded since the last call.
    fn take(&self) -> ReportTaskCounts {
        let Unreported {
            counts: all,
            finished,
            failed,
            dropped,
            latencies,
        } = std::mem::take(&mut *self.unreported.lock());
        let (retries, rebuilt) = {
            let now = super::submission::retries();
            let now = ([now.0, now.1], super::submission::rebuilt());
            let mut last = self.reported_totals.lock();
            let delta = ([now.0[0] - last.0[0], now.0[1] - last.0[1]], now.1 - last.1);
            *last = now;
            delta
        };
        let mut events: Vec<Ended> = finished.into_iter().chain(failed).collect();
        events.sort_by_key(|e| e.returned_us);
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
        let events = events
            .into_iter()
            .map(|e| TaskEvent {
                task_id: e.task_id.to_string(),
                name: e.name,
                outcome: e.outcome,
                retries: e.retries,
                error: e.error,
                job_id: self.job_id.clone(),
                submitted_us: e.submitted_us,
                returned_us: e.returned_us,
            })
            .collect();
        ReportTaskCounts {
            counts: out,
            events,
            dropped,
            runs: Vec::new(),
            running: None,
            worker_id: String::new(),
            latencies,
            retries,
            rebuilt,
            pending: None,
        }
    }

    /// Sends what was counted, and what this process ran (`runs`), to the
    /// raylet; kept for the next try when it cannot be sent (the ended
    /// runs are not).
    pub(crate) async fn report(&self, runs: &TaskRuns, raylet: &Connection, periodic: bool) {
        let mut report = self.take();
        (report.runs, report.running) = runs.take(periodic);
        if periodic && self.enabled {
            report.pending = self.pending();
        }
        report.worker_id = runs.worker_id().to_string();
        if report.counts.is_empty()
            && report.dropped == 0
            && report.runs.is_empty()
            && report.running.is_none()
            && report.retries == [0, 0]
            && report.rebuilt == 0
            && report.pending.is_none()
        {
            return;
        }
        let sent = raylet.request(report.clone()).await;
        if let Err(e) = sent {
            runs.not_sent();
            *self.waiting_sent.lock() = true;
            tracing::debug!(error = %e, "task counts not reported; kept for the next report");
            {
                let mut last = self.reported_totals.lock();
                last.0[0] -= report.retries[0];
                last.0[1] -= report.retries[1];
                last.1 -= report.rebuilt;
            }
            let mut unreported = self.unreported.lock();
            for (kept, sent) in unreported.latencies.iter_mut().zip(&report.latencies) {
                kept.merge(sent);
            }
            for c in report.counts {
                let entry = unreported.counts.entry(c.name).or_insert([0; 4]);
                entry[slot(c.outcome, c.is_retry)] += c.count;
            }
            // Older than what was recorded meanwhile, but kept in order
            // of their end within each bound (their ids read back).
            unreported.dropped += report.dropped;
            let newer: Vec<Ended> = std::mem::take(&mut unreported.finished)
                .into_iter()
                .chain(std::mem::take(&mut unreported.failed))
                .collect();
            for event in report.events {
                match TaskId::parse(&event.task_id) {
                    Some(task_id) => unreported.keep(Ended {
                        task_id,
                        name: event.name,
                        outcome: event.outcome,
                        retries: event.retries,
                        error: event.error,
                        submitted_us: event.submitted_us,
                        returned_us: event.returned_us,
                    }),
                    None => unreported.dropped += 1,
                }
            }
            for event in newer {
                unreported.keep(event);
            }
        }
    }

    /// Reports every `period`, and soon after a run ends, until the
    /// connection closes.
    pub(crate) fn start_reporting(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
        raylet: Connection,
        period: Duration,
        runs: Arc<TaskRuns>,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        rt.spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let periodic = tokio::select! {
                    _ = tick.tick() => true,
                    // A run ended: sent soon, with what ends meanwhile.
                    _ = runs.run_ended() => {
                        tokio::time::sleep(super::task_runs::REPORT_SOON.min(period)).await;
                        false
                    }
                };
                if raylet.is_closed() {
                    return;
                }
                this.report(&runs, &raylet, periodic).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_once_by_function_outcome_and_retry() {
        let counts = TaskCounts::new("job-1".into(), true, Box::new(|_| Vec::new()));
        for _ in 0..3 {
            counts.record(
                TaskId::new(),
                "add",
                false,
                0,
                TaskOutcome::Finished,
                0,
                None,
            );
        }
        let failed = TaskId::new();
        counts.record(
            failed,
            "add",
            false,
            0,
            TaskOutcome::Failed,
            1,
            Some("boom".into()),
        );
        counts.record(TaskId::new(), "boom", true, 1, TaskOutcome::Failed, 0, None);
        let report = counts.take();
        assert_eq!(report.events.len(), 5);
        assert_eq!(report.events[3].error.as_deref(), Some("boom"));
        assert_eq!(report.events[3].task_id, failed.to_string());
        assert_eq!(TaskId::parse(&report.events[3].task_id), Some(failed));
        assert_eq!(report.events[3].job_id, "job-1");
        let mut taken = report.counts;
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
        assert_eq!(
            report.latencies[0].counts.iter().sum::<u64>(),
            0,
            "no submission time"
        );
        assert_eq!(
            report.latencies[1].counts.iter().sum::<u64>(),
            1,
            "the actor call"
        );
        assert!(counts.take().counts.is_empty());
    }

    #[test]
    fn a_busy_owner_sends_its_newest_finished_tasks_every_failure_and_exact_counts() {
        let counts = TaskCounts::new("job-1".into(), true, Box::new(|_| Vec::new()));
        let mut last = TaskId::new();
        for i in 0..(FINISHED_KEPT + 500) {
            last = TaskId::new();
            counts.record(last, "add", false, 0, TaskOutcome::Finished, 0, None);
            if i % 500 == 0 {
                counts.record(
                    TaskId::new(),
                    "add",
                    false,
                    0,
                    TaskOutcome::Failed,
                    0,
                    Some("x".into()),
                );
            }
        }
        let report = counts.take();
        assert_eq!(report.dropped, 500, "the oldest finished ones");
        let failed = report
            .events
            .iter()
            .filter(|e| e.outcome == TaskOutcome::Failed)
            .count();
        assert_eq!(failed, 3, "every failure");
        assert_eq!(report.events.len(), FINISHED_KEPT + 3);
        assert!(report.events.iter().any(|e| e.task_id == last.to_string()));
        let finished: u64 = report
            .counts
            .iter()
            .filter(|c| c.outcome == TaskOutcome::Finished)
            .map(|c| c.count)
            .sum();
        assert_eq!(finished, (FINISHED_KEPT + 500) as u64, "counts stay exact");
    }
}
