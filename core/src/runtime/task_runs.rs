//! The tasks and actor calls this process executes: what runs now and
//! what ran since the last report, with when (for the state API's
//! `RUNNING` rows, the executing node and worker of each task, and
//! `prism timeline`). Sent to the node's raylet with the task counts.

use parking_lot::Mutex;
use prism_protocol::clock::unix_us;
use prism_protocol::ids::{ActorId, TaskId};
use prism_protocol::messages::{RunKind, TaskRun};
use std::collections::VecDeque;
use std::sync::Arc;

/// Ended runs reported per period (`task_events_report_interval_ms`): the
/// first ones of each; the rest are not recorded, so that a busy worker
/// (tens of thousands of runs a second) spends its time running them,
/// not describing them to a node that keeps 10,000 in all.
const ENDED_KEPT: usize = 1_000;

/// How soon after a run ends it is reported when no report is due
/// sooner: a worker is stopped at once when its job ends, so runs wait
/// for the next periodic report only as long as this.
pub(crate) const REPORT_SOON: std::time::Duration = std::time::Duration::from_millis(20);

/// What ran: a task or actor call, or an actor's constructor (named by
/// its actor, as it has no task id of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunId {
    /// A task or actor call.
    Task(TaskId),
    /// An actor's constructor.
    Constructor(ActorId),
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunId::Task(id) => id.fmt(f),
            RunId::Constructor(id) => id.fmt(f),
        }
    }
}

/// A run, as recorded: its ids are written out only when it is
/// reported, off the task's path.
#[derive(Debug, Clone)]
struct Run {
    id: RunId,
    name: String,
    kind: RunKind,
    actor_id: Option<ActorId>,
    start_us: u64,
}

#[derive(Debug, Default)]
struct Book {
    running: Vec<Run>,
    ended: VecDeque<(Run, u64, bool)>,
    /// `running` changed since the last report.
    changed: bool,
    /// A run ended and the reporter was woken to send it soon.
    woken: bool,
    /// Ended runs recorded in this period.
    recorded: usize,
}

/// What this process runs and ran.
#[derive(Debug)]
pub(crate) struct TaskRuns {
    book: Mutex<Book>,
    job_id: String,
    worker_id: String,
    pid: u32,
    enabled: bool,
    /// Wakes the reporter when a run ends.
    ended: tokio::sync::Notify,
}

/// One run in progress: ends when [`end`](RunGuard::end) is called, or,
/// failed, when dropped first (a call cancelled or unwound).
#[derive(Debug)]
pub(crate) struct RunGuard {
    runs: Option<Arc<TaskRuns>>,
    id: RunId,
}

impl RunGuard {
    /// The run ended, `failed` or not.
    pub(crate) fn end(mut self, failed: bool) {
        if let Some(runs) = self.runs.take() {
            runs.end(self.id, failed);
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if let Some(runs) = self.runs.take() {
            runs.end(self.id, true);
        }
    }
}

impl TaskRuns {
    /// The runs of worker `worker_id` of `job_id` (this process); nothing
    /// is recorded unless `enabled`.
    pub(crate) fn new(job_id: String, worker_id: String, enabled: bool) -> TaskRuns {
        TaskRuns {
            book: Mutex::default(),
            job_id,
            worker_id,
            pid: std::process::id(),
            enabled,
            ended: tokio::sync::Notify::new(),
        }
    }

    /// The worker whose runs these are.
    pub(crate) fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// A run starts now. Not recorded once this period's runs are (a
    /// busy worker's later runs in the period, which end in microseconds,
    /// go unrecorded at the cost of one lock).
    pub(crate) fn begin(
        self: &Arc<Self>,
        id: RunId,
        name: &str,
        kind: RunKind,
        actor_id: Option<ActorId>,
    ) -> RunGuard {
        if !self.enabled {
            return RunGuard { runs: None, id };
        }
        let mut book = self.book.lock();
        if book.recorded >= ENDED_KEPT {
            return RunGuard { runs: None, id };
        }
        let run = Run {
            id,
            name: name.to_string(),
            kind,
            actor_id,
            start_us: unix_us(),
        };
        book.running.push(run);
        book.changed = true;
        RunGuard {
            runs: Some(self.clone()),
            id,
        }
    }

    fn end(&self, id: RunId, failed: bool) {
        let end_us = unix_us();
        let mut book = self.book.lock();
        let Some(at) = book.running.iter().rposition(|r| r.id == id) else {
            return;
        };
        let run = book.running.swap_remove(at);
        book.changed = true;
        if book.recorded >= ENDED_KEPT {
            return;
        }
        book.recorded += 1;
        book.ended.push_back((run, end_us, failed));
        let wake = !std::mem::replace(&mut book.woken, true);
        drop(book);
        if wake {
            self.ended.notify_one();
        }
    }

    /// The functions running now, with their task ids.
    pub(crate) fn running_names(&self) -> Vec<String> {
        let book = self.book.lock();
        book.running
            .iter()
            .map(|r| format!("{} ({})", r.name, r.id))
            .collect()
    }

    /// Waits until a run ends that is not reported yet.
    pub(crate) async fn run_ended(&self) {
        self.ended.notified().await;
    }

    fn wire(&self, run: Run, end_us: Option<u64>, failed: bool) -> TaskRun {
        TaskRun {
            task_id: run.id.to_string(),
            name: run.name,
            kind: run.kind,
            actor_id: run.actor_id.map(|a| a.to_string()),
            job_id: self.job_id.clone(),
            worker_id: self.worker_id.clone(),
            pid: self.pid,
            start_us: run.start_us,
            end_us,
            failed,
        }
    }

    /// The runs that ended since the last call, oldest first, and what
    /// runs now if that changed since the last call; `new_period`: a
    /// periodic report, after which runs are recorded again.
    pub(crate) fn take(&self, new_period: bool) -> (Vec<TaskRun>, Option<Vec<TaskRun>>) {
        let (ended, running) = {
            let mut book = self.book.lock();
            book.woken = false;
            if new_period {
                book.recorded = 0;
            }
            let ended = std::mem::take(&mut book.ended);
            let running = std::mem::take(&mut book.changed).then(|| book.running.clone());
            (ended, running)
        };
        let ended = ended
            .into_iter()
            .map(|(run, end, failed)| self.wire(run, Some(end), failed))
            .collect();
        let running =
            running.map(|all| all.into_iter().map(|r| self.wire(r, None, false)).collect());
        (ended, running)
    }

    /// A report that could not be sent: what runs now is sent again with
    /// the next one (the ended runs it carried are not).
    pub(crate) fn not_sent(&self) {
        self.book.lock().changed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_reported_once_and_what_runs_when_it_changed() {
        let runs = Arc::new(TaskRuns::new("job-1".into(), "w-1".into(), true));
        let (ta, tb, actor) = (TaskId::new(), TaskId::new(), ActorId::new());
        let a = runs.begin(RunId::Task(ta), "add", RunKind::Task, None);
        let b = runs.begin(
            RunId::Task(tb),
            "Counter.incr",
            RunKind::ActorCall,
            Some(actor),
        );
        let (ended, running) = runs.take(false);
        assert!(ended.is_empty());
        let running = running.unwrap_or_default();
        assert_eq!(running.len(), 2);
        assert!(running
            .iter()
            .all(|r| r.end_us.is_none() && r.job_id == "job-1"));
        assert_eq!(runs.take(false).1, None, "unchanged: not sent again");
        a.end(false);
        drop(b);
        let (ended, running) = runs.take(false);
        assert_eq!(running, Some(Vec::new()), "nothing runs any more");
        assert_eq!(ended.len(), 2);
        assert_eq!(ended[0].task_id, ta.to_string());
        assert!(!ended[0].failed);
        assert!(ended[0].end_us >= Some(ended[0].start_us));
        assert!(ended[1].failed, "dropped before its end: failed");
        assert_eq!(ended[1].actor_id, Some(actor.to_string()));
        assert_eq!(ended[1].pid, std::process::id());
    }

    #[test]
    fn a_busy_worker_reports_its_first_runs_of_each_period_and_nothing_when_disabled() {
        let runs = Arc::new(TaskRuns::new("j".into(), "w".into(), true));
        let mut ids = Vec::new();
        for _ in 0..(ENDED_KEPT + 10) {
            let id = TaskId::new();
            ids.push(id);
            runs.begin(RunId::Task(id), "f", RunKind::Task, None)
                .end(false);
        }
        let (ended, _) = runs.take(false);
        assert_eq!(ended.len(), ENDED_KEPT);
        assert_eq!(
            ended[ENDED_KEPT - 1].task_id,
            ids[ENDED_KEPT - 1].to_string()
        );
        let last = TaskId::new();
        let unrecorded = runs.begin(RunId::Task(last), "f", RunKind::Task, None);
        assert_eq!(runs.take(false).1, None, "not listed as running");
        unrecorded.end(false);
        assert!(runs.take(true).0.is_empty(), "over this period's budget");
        runs.begin(RunId::Task(last), "f", RunKind::Task, None)
            .end(false);
        assert_eq!(runs.take(false).0.len(), 1, "recorded again in the next");
        let off = Arc::new(TaskRuns::new("j".into(), "w".into(), false));
        off.begin(RunId::Task(last), "f", RunKind::Task, None)
            .end(false);
        assert_eq!(off.take(true), (Vec::new(), None));
    }
}
