//! What is submitted: a task or actor call with what it holds and its
//! retry policy ([`Submission`]), and the key tasks are queued by
//! ([`SchedulingKey`]).
//!
//! # Retries
//!
//! [`Submission::retry_after`] is the one place that decides whether a
//! failure is tried again: a worker that died or an actor that is
//! restarting always may be (within the attempts left); the function's own
//! error only with `retry_exceptions`, and then only when its message
//! matches one of `retry_matching` (if any are given).

use crate::codec::KeepAlive;
use crate::Error;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::{ArgSpec, BundleRef, EnvVars, SchedulingStrategy, TaskSpec};
use prism_protocol::resources::ResourceSet;

/// What tasks are queued by: the resources a lease must hold, and the
/// placement-group bundle it must come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SchedulingKey {
    pub(crate) shape: ResourceSet,
    pub(crate) bundle: Option<BundleRef>,
    pub(crate) strategy: SchedulingStrategy,
    /// The worker's environment variables beyond the job's.
    pub(crate) env_vars: EnvVars,
}

/// A task (or actor call) with the object ids whose `submitted` count it
/// holds until it answers, and what may be retried.
#[derive(Debug)]
pub(crate) struct Submission {
    pub(crate) spec: TaskSpec,
    pub(crate) held: Vec<ObjectId>,
    /// Attempts left after a failure that may be retried (-1: no limit).
    pub(crate) retries_left: i64,
    /// Whether the function's own errors and panics are retried too.
    pub(crate) retry_exceptions: bool,
    /// With `retry_exceptions`: only errors whose message contains one of
    /// these (empty: all).
    pub(crate) retry_matching: Vec<String>,
    /// Why each earlier attempt failed.
    pub(crate) failures: Vec<String>,
    /// An actor call's hold on its actor's handle object: the actor is
    /// not stopped for lack of handles while the call is out.
    pub(crate) actor_handle: Option<KeepAlive>,
    /// Whether a value argument holds object references: `held` has an
    /// object that no argument named by reference when it was made (before
    /// resolution turned small ready ones into values).
    pub(crate) refs_in_values: bool,
    /// When it was submitted, in microseconds since the Unix epoch.
    pub(crate) submitted_us: u64,
}

/// Attempts this process made again: tasks, and actor calls sent again to
/// a restarted actor.
static TASK_RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static ACTOR_CALL_RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Objects made again after their node died, since the process started.
static REBUILT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many objects this process made again from their lineage.
pub(crate) fn rebuilt() -> u64 {
    REBUILT.load(std::sync::atomic::Ordering::Relaxed)
}

/// One more object made again from its lineage.
pub(crate) fn note_rebuilt() {
    REBUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// What this process retried since it started: (tasks, actor calls).
pub(crate) fn retries() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (TASK_RETRIES.load(Relaxed), ACTOR_CALL_RETRIES.load(Relaxed))
}

impl Submission {
    /// A call that is not retried.
    pub(crate) fn new(spec: TaskSpec, held: Vec<ObjectId>) -> Self {
        let by_ref = |id: &ObjectId| {
            spec.args
                .iter()
                .any(|a| matches!(a, ArgSpec::Ref(info) if info.id == *id))
        };
        let refs_in_values = held.iter().any(|h| !by_ref(h));
        Submission {
            refs_in_values,
            spec,
            held,
            retries_left: 0,
            retry_exceptions: false,
            retry_matching: Vec::new(),
            failures: Vec::new(),
            actor_handle: None,
            submitted_us: prism_protocol::clock::unix_us(),
        }
    }

    /// The error it ends with when `prism::cancel` stops it; `force`: its
    /// worker was stopped.
    pub(crate) fn cancelled(&self, force: bool) -> Error {
        Error::TaskCancelled {
            function: self.spec.function.clone(),
            how: if force { ", force" } else { "" }.to_string(),
        }
    }

    /// Keeps `handle` (an actor's handle object) until the call ends.
    pub(crate) fn holding(mut self, handle: Option<KeepAlive>) -> Self {
        self.actor_handle = handle;
        self
    }

    /// Retried up to `max_retries` times (-1: no limit) when its worker
    /// dies, and with `retry_exceptions` when the function fails.
    pub(crate) fn retries(
        mut self,
        max_retries: i64,
        retry_exceptions: bool,
        retry_matching: Vec<String>,
    ) -> Self {
        self.retries_left = max_retries;
        self.retry_exceptions = retry_exceptions;
        self.retry_matching = retry_matching;
        self
    }

    /// Whether `error` ends this attempt with another one to come; if so,
    /// records it.
    pub(crate) fn retry_after(&mut self, error: &Error) -> bool {
        let retriable = match error {
            Error::WorkerDied { .. } | Error::ActorUnavailable { .. } => true,
            Error::TaskFailed { message, .. } => {
                self.retry_exceptions
                    && (self.retry_matching.is_empty()
                        || self
                            .retry_matching
                            .iter()
                            .any(|p| message.contains(p.as_str())))
            }
            _ => false,
        };
        if !retriable || self.retries_left == 0 {
            return false;
        }
        if self.retries_left > 0 {
            self.retries_left -= 1;
        }
        let counter = match error {
            Error::ActorUnavailable { .. } => &ACTOR_CALL_RETRIES,
            _ => &TASK_RETRIES,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.failures.push(error.to_string());
        true
    }

    /// The final error, saying how many attempts were made and why the
    /// earlier ones failed.
    pub(crate) fn final_error(&self, error: Error) -> Error {
        if self.failures.is_empty() {
            return error;
        }
        let attempts = self.failures.len() + 1;
        let earlier = self
            .failures
            .iter()
            .enumerate()
            .map(|(i, f)| format!("attempt {}: {f}", i + 1))
            .collect::<Vec<_>>()
            .join("; ");
        let note = format!(" (attempt {attempts} of {attempts}; earlier: {earlier})");
        match error {
            Error::WorkerDied {
                function,
                worker,
                pid,
                reason,
            } => Error::WorkerDied {
                function,
                worker,
                pid,
                reason: reason + &note,
            },
            Error::TaskFailed {
                function,
                message,
                kind,
                worker,
                pid,
            } => Error::TaskFailed {
                function,
                message: message + &note,
                kind,
                worker,
                pid,
            },
            other => other,
        }
    }
}
