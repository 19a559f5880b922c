//! Processes that exited on the nodes, passed on to the other nodes with
//! their heartbeats' answers. A node tells the processes of its own that
//! exited (drivers, workers, actors: each an owner of objects) in its next
//! heartbeat; every other node hears of them in the answer to its next
//! one, and frees what they owned there. So a burst of exits (thousands of
//! actors killed) costs no message of its own: each node learns of them in
//! the heartbeats it sends anyway, instead of each exit being sent to every
//! node.
//!
//! The log keeps exits for [`KEEP_FOR`] and at most [`KEEP_MOST`] of them;
//! a node that has not beaten for longer misses the oldest (a copy of a
//! dead owner's object then stays until its node frees it for room).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long an exit stays in the log.
pub(crate) const KEEP_FOR: Duration = Duration::from_secs(300);
/// The most exits the log keeps.
pub(crate) const KEEP_MOST: usize = 200_000;

#[derive(Debug)]
struct Exit {
    at: Instant,
    node: String,
    address: String,
}

/// The exits told, numbered in the order they came.
#[derive(Debug, Default)]
pub(crate) struct ExitLog {
    /// The number of the first exit kept; exits are numbered from 1.
    first: u64,
    kept: VecDeque<Exit>,
}

impl ExitLog {
    /// The number the next exit gets: what an answer tells a node to ask
    /// from next time.
    pub(crate) fn next(&self) -> u64 {
        self.first.max(1) + self.kept.len() as u64
    }

    /// Records that processes at `addresses` of node `node` exited, and
    /// forgets what is older than [`KEEP_FOR`] or beyond [`KEEP_MOST`].
    pub(crate) fn record(&mut self, node: &str, addresses: Vec<String>, now: Instant) {
        self.first = self.first.max(1);
        for address in addresses {
            self.kept.push_back(Exit {
                at: now,
                node: node.to_string(),
                address,
            });
        }
        while self
            .kept
            .front()
            .is_some_and(|e| self.kept.len() > KEEP_MOST || now.duration_since(e.at) > KEEP_FOR)
        {
            self.kept.pop_front();
            self.first += 1;
        }
    }

    /// The addresses of the exits numbered `from` on that nodes other than
    /// `node` told. `from` is 0 for a node that has heard of none (it just
    /// joined, or its last answer came from another run of the control
    /// store): it gets none, only where to ask from.
    pub(crate) fn since(&self, node: &str, from: u64) -> Vec<String> {
        if from == 0 || from >= self.next() {
            return Vec::new();
        }
        let skip = from.saturating_sub(self.first.max(1)) as usize;
        self.kept
            .range(skip.min(self.kept.len())..)
            .filter(|e| e.node != node)
            .map(|e| e.address.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_node_hears_of_the_others_exits_once_from_where_it_last_asked() {
        let mut log = ExitLog::default();
        let now = Instant::now();
        let start = log.next();
        assert!(log.since("b", 0).is_empty(), "a new node hears of nothing");
        log.record("a", strings(&["a:1", "a:2"]), now);
        log.record("b", strings(&["b:1"]), now);
        assert_eq!(log.since("b", start), strings(&["a:1", "a:2"]));
        assert_eq!(log.since("a", start), strings(&["b:1"]));
        assert_eq!(log.since("c", start), strings(&["a:1", "a:2", "b:1"]));
        let seen = log.next();
        log.record("a", strings(&["a:3"]), now);
        assert_eq!(log.since("c", seen), strings(&["a:3"]));
        assert!(log.since("c", log.next()).is_empty());
        assert!(log.since("c", 0).is_empty());
        assert!(
            log.since("c", log.next() + 10).is_empty(),
            "from another run"
        );
    }

    #[test]
    fn old_exits_are_forgotten_by_age_and_count() {
        let mut log = ExitLog::default();
        let then = Instant::now();
        let start = log.next();
        log.record("a", strings(&["a:1"]), then);
        log.record(
            "a",
            strings(&["a:2"]),
            then + KEEP_FOR + Duration::from_secs(1),
        );
        assert_eq!(log.since("b", start), strings(&["a:2"]), "a:1 aged out");
        let many: Vec<String> = (0..KEEP_MOST + 5).map(|i| format!("x:{i}")).collect();
        let later = then + KEEP_FOR + Duration::from_secs(2);
        log.record("a", many, later);
        let heard = log.since("b", start);
        assert_eq!(heard.len(), KEEP_MOST);
        assert_eq!(heard.last().map(String::as_str), Some("x:200004"));
        assert_eq!(log.next(), start + KEEP_MOST as u64 + 7);
    }
}
