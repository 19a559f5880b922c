//! The node's task table: the tasks and actor calls its processes owned
//! that ended (as their owners report them) and the ones its workers ran
//! or run now (as the workers report them), one row per task, the oldest
//! dropped first beyond a bound. What `prism list tasks` and `prism
//! timeline` read; a task owned here and run on another node has a row on
//! each, which the head joins.

use parking_lot::Mutex;
use prism_protocol::messages::{PendingTask, TaskEvent, TaskRun};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// One task as this node knows it: how it ended (from its owner, when
/// the owner is here) and its latest run (when it ran here).
#[derive(Debug, Default)]
struct Record {
    ended: Option<TaskEvent>,
    run: Option<TaskRun>,
}

#[derive(Debug, Default)]
struct Table {
    kept: usize,
    records: HashMap<String, Record>,
    /// Task ids, in the order the node first heard of them.
    order: VecDeque<String>,
    /// What each worker runs now, by worker id.
    running: HashMap<String, Vec<TaskRun>>,
    /// The tasks each owner's queues hold, waiting for a worker, by the
    /// owner's connection.
    pending: HashMap<u64, Vec<PendingTask>>,
    /// Ended tasks not kept: dropped here or by their owner.
    dropped: u64,
}

/// The node's task table (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct TaskTable {
    table: Mutex<Table>,
}

impl TaskTable {
    /// Keeps at most `kept` tasks.
    pub(crate) fn new(kept: usize) -> TaskTable {
        TaskTable {
            table: Mutex::new(Table {
                kept,
                ..Table::default()
            }),
        }
    }

    /// Adds a process's report: tasks it owned that ended (`dropped`
    /// more it did not keep), runs of worker `worker_id` that ended, and
    /// what that worker runs now when it changed.
    pub(crate) fn add(
        &self,
        events: Vec<TaskEvent>,
        dropped: u64,
        worker_id: &str,
        runs: Vec<TaskRun>,
        running: Option<Vec<TaskRun>>,
    ) {
        let mut table = self.table.lock();
        table.dropped += dropped;
        if let Some(now) = running {
            if now.is_empty() {
                table.running.remove(worker_id);
            } else {
                table.running.insert(worker_id.to_string(), now);
            }
        }
        for event in events {
            let id = event.task_id.clone();
            table.record(id).ended = Some(event);
        }
        for run in runs {
            let id = run.task_id.clone();
            table.record(id).run = Some(run);
        }
    }

    /// Owner `reporter` (a connection) told what waits in its queues now.
    pub(crate) fn set_pending(&self, reporter: u64, now: Vec<PendingTask>) {
        let mut table = self.table.lock();
        if now.is_empty() {
            table.pending.remove(&reporter);
        } else {
            table.pending.insert(reporter, now);
        }
    }

    /// An owner's connection closed: nothing of it waits any more.
    pub(crate) fn reporter_gone(&self, reporter: u64) {
        self.table.lock().pending.remove(&reporter);
    }

    /// Tasks waiting for a worker, by function.
    pub(crate) fn pending_counts(&self) -> BTreeMap<String, u64> {
        let table = self.table.lock();
        by_name(table.pending.values().flatten().map(|t| &t.name))
    }

    /// A worker exited: it runs nothing any more.
    pub(crate) fn worker_gone(&self, worker_id: &str) {
        self.table.lock().running.remove(worker_id);
    }

    /// How many ended tasks are not kept.
    pub(crate) fn dropped(&self) -> u64 {
        self.table.lock().dropped
    }

    /// Tasks running now, by function.
    pub(crate) fn running_counts(&self) -> BTreeMap<String, u64> {
        let table = self.table.lock();
        by_name(table.running.values().flatten().map(|r| &r.name))
    }

    /// At most `limit` rows, the running tasks first, then the waiting
    /// ones, then the newest;
    /// how many rows there are in all; and how many ended tasks are not
    /// kept.
    pub(crate) fn rows(&self, limit: usize) -> (Vec<Value>, usize, u64) {
        let table = self.table.lock();
        let running: Vec<&TaskRun> = table
            .running
            .values()
            .flatten()
            .filter(|r| {
                table
                    .records
                    .get(&r.task_id)
                    .is_none_or(|k| k.ended.is_none())
            })
            .collect();
        let running_ids: std::collections::HashSet<&str> =
            running.iter().map(|r| r.task_id.as_str()).collect();
        let waiting: Vec<&PendingTask> = table
            .pending
            .values()
            .flatten()
            .filter(|p| {
                !running_ids.contains(p.task_id.as_str()) && !table.records.contains_key(&p.task_id)
            })
            .collect();
        let total = running.len() + waiting.len() + table.records.len();
        let mut rows: Vec<Value> = running
            .iter()
            .take(limit)
            .map(|run| row(None, Some(run)))
            .collect();
        rows.extend(
            waiting
                .iter()
                .take(limit.saturating_sub(rows.len()))
                .map(|p| pending_row(p)),
        );
        let ended = table
            .order
            .iter()
            .rev()
            .filter_map(|id| table.records.get(id))
            .take(limit.saturating_sub(rows.len()))
            .map(|r| row(r.ended.as_ref(), r.run.as_ref()));
        rows.extend(ended);
        (rows, total, table.dropped)
    }
}

impl Table {
    /// The record of task `id`, made (and the oldest dropped beyond the
    /// bound) if new.
    fn record(&mut self, id: String) -> &mut Record {
        if !self.records.contains_key(&id) {
            while self.records.len() >= self.kept.max(1) {
                let Some(oldest) = self.order.pop_front() else {
                    break;
                };
                if self.records.remove(&oldest).is_some() {
                    self.dropped += 1;
                }
            }
            self.order.push_back(id.clone());
        }
        self.records.entry(id).or_default()
    }
}

/// How many of each name.
fn by_name<'a>(names: impl Iterator<Item = &'a String>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for name in names {
        *counts.entry(name.clone()).or_insert(0) += 1;
    }
    counts
}

/// A task waiting for a worker, as its owner reported it.
fn pending_row(task: &PendingTask) -> Value {
    json!({
        "task_id": task.task_id,
        "name": task.name,
        "state": "PENDING_NODE_ASSIGNMENT",
        "type": Value::Null,
        "job_id": task.job_id,
        "creation_time_ms": task.submitted_us / 1000,
        "submitted_us": task.submitted_us,
        "ran_here": false,
    })
}

/// A row, in Ray's field names where Ray has them: the owner's view
/// (`ended`) and the run here (`run`), either or both. `ran_here` tells
/// the head that the node answering is where the task ran.
fn row(ended: Option<&TaskEvent>, run: Option<&TaskRun>) -> Value {
    let state = match (ended, run) {
        (Some(e), _) => e.outcome.ray_state(),
        (None, Some(r)) if r.end_us.is_none() => "RUNNING",
        (None, Some(r)) if r.failed => "FAILED",
        _ => "FINISHED",
    };
    let ms = |us: Option<u64>| us.map(|us| us / 1000);
    let end_us = run.and_then(|r| r.end_us).or(ended.map(|e| e.returned_us));
    let first = |a: Option<&String>, b: Option<&String>| a.or(b).cloned();
    json!({
        "task_id": first(ended.map(|e| &e.task_id), run.map(|r| &r.task_id)),
        "name": first(ended.map(|e| &e.name), run.map(|r| &r.name)),
        "state": state,
        "type": run.map(|r| r.kind.ray_type()),
        "job_id": first(ended.map(|e| &e.job_id), run.map(|r| &r.job_id)),
        "actor_id": run.and_then(|r| r.actor_id.clone()),
        "retries": ended.map(|e| e.retries),
        "error_message": ended.and_then(|e| e.error.clone()),
        "worker_id": run.map(|r| &r.worker_id),
        "worker_pid": run.map(|r| r.pid),
        "creation_time_ms": ms(ended.map(|e| e.submitted_us)),
        "start_time_ms": ms(run.map(|r| r.start_us)),
        "end_time_ms": ms(end_us),
        "submitted_us": ended.map(|e| e.submitted_us),
        "start_us": run.map(|r| r.start_us),
        "end_us": run.and_then(|r| r.end_us),
        "returned_us": ended.map(|e| e.returned_us),
        "ran_here": run.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prism_protocol::messages::{RunKind, TaskOutcome};

    fn event(id: &str) -> TaskEvent {
        TaskEvent {
            task_id: id.into(),
            name: "add".into(),
            outcome: TaskOutcome::Finished,
            retries: 0,
            error: None,
            job_id: "j".into(),
            submitted_us: 1_000,
            returned_us: 9_000,
        }
    }

    fn run(id: &str, end_us: Option<u64>) -> TaskRun {
        TaskRun {
            task_id: id.into(),
            name: "add".into(),
            kind: RunKind::Task,
            actor_id: None,
            job_id: "j".into(),
            worker_id: "w1".into(),
            pid: 42,
            start_us: 2_000,
            end_us,
            failed: false,
        }
    }

    #[test]
    fn a_task_owned_and_run_here_is_one_row_and_the_oldest_go_first() {
        let table = TaskTable::new(2);
        table.add(vec![], 0, "w1", vec![run("a", Some(5_000))], None);
        table.add(vec![event("a")], 0, "", vec![], None);
        let (rows, total, dropped) = table.rows(10);
        assert_eq!((rows.len(), total, dropped), (1, 1, 0));
        let a = &rows[0];
        assert_eq!(a["state"], "FINISHED");
        assert_eq!(a["worker_pid"], 42);
        assert_eq!(a["start_us"], 2_000);
        assert_eq!(a["end_us"], 5_000);
        assert_eq!(a["returned_us"], 9_000);
        assert_eq!(a["ran_here"], true);
        table.add(vec![event("b"), event("c")], 3, "", vec![], None);
        let (rows, total, dropped) = table.rows(10);
        assert_eq!((total, dropped), (2, 4), "a dropped here, 3 by the owner");
        assert_eq!(rows[0]["task_id"], "c", "newest first");
        assert_eq!(rows[1]["ran_here"], false);
    }

    #[test]
    fn running_tasks_come_first_until_their_worker_reports_or_goes() {
        let table = TaskTable::new(10);
        table.add(vec![event("old")], 0, "", vec![], None);
        table.add(vec![], 0, "w1", vec![], Some(vec![run("r", None)]));
        let (rows, total, _) = table.rows(10);
        assert_eq!(total, 2);
        assert_eq!(rows[0]["state"], "RUNNING");
        assert_eq!(table.running_counts().get("add"), Some(&1));
        table.worker_gone("w1");
        assert!(table.running_counts().is_empty());
        table.add(vec![], 0, "w1", vec![], Some(vec![run("r", None)]));
        table.add(vec![], 0, "w1", vec![run("r", Some(3_000))], Some(vec![]));
        let (rows, _, _) = table.rows(1);
        assert_eq!(rows[0]["state"], "FINISHED");
        assert_eq!(rows[0]["task_id"], "r");
    }

    #[test]
    fn waiting_tasks_are_listed_until_they_run_or_their_owner_goes() {
        let table = TaskTable::new(10);
        let waiting = |id: &str| PendingTask {
            task_id: id.into(),
            name: "add".into(),
            job_id: "j".into(),
            submitted_us: 5_000,
        };
        table.set_pending(7, vec![waiting("p"), waiting("r")]);
        table.add(vec![], 0, "w1", vec![], Some(vec![run("r", None)]));
        let (rows, total, _) = table.rows(10);
        assert_eq!(total, 2, "r runs: listed once");
        assert_eq!(rows[0]["state"], "RUNNING");
        assert_eq!(rows[1]["state"], "PENDING_NODE_ASSIGNMENT");
        assert_eq!(rows[1]["creation_time_ms"], 5);
        assert_eq!(table.pending_counts().get("add"), Some(&2));
        table.reporter_gone(7);
        assert!(table.pending_counts().is_empty());
        table.set_pending(8, vec![waiting("q")]);
        table.set_pending(8, vec![]);
        assert_eq!(table.rows(10).1, 1);
    }
}
