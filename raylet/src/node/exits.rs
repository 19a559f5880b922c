//! Why recent workers exited ([`ExitLog`]), for callers that saw one
//! vanish.

use prism_protocol::ids::WorkerId;
use std::collections::HashMap;

/// Why recent workers exited, for callers that saw one vanish (the last
/// [`EXITS_KEPT`]). The first reason recorded stays: a kill's reason is
/// recorded before the kill, the exit status after it.
#[derive(Debug, Default)]
pub(super) struct ExitLog {
    order: std::collections::VecDeque<WorkerId>,
    pub(super) reasons: HashMap<WorkerId, String>,
}

const EXITS_KEPT: usize = 4096;

impl ExitLog {
    pub(super) fn record(&mut self, worker: WorkerId, reason: String) {
        if self.reasons.contains_key(&worker) {
            return;
        }
        self.order.push_back(worker);
        self.reasons.insert(worker, reason);
        while self.order.len() > EXITS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.reasons.remove(&old);
            }
        }
    }
}
