//! Waiting from synchronous code for a future of the runtime.

use super::spin;
use crate::{Error, Result};
use std::future::Future;

/// Runs a future to completion from synchronous code, on `rt`.
pub(crate) fn block_on<T: Send + 'static>(
    rt: &tokio::runtime::Handle,
    fut: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    if tokio::runtime::Handle::try_current().is_err() {
        let _entered = rt.enter();
        return spin::block_on(fut);
    }
    // Inside a runtime thread (a blocking task, or a blocking call from
    // async code): run it on the runtime and wait for the answer on this
    // thread. On a worker of a multi-thread runtime, the wait first hands
    // the worker's other tasks to another thread, so that a few such waits
    // (in async actor calls, say) cannot stop the runtime that serves them.
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    let answer = if multi_thread {
        tokio::task::block_in_place(|| rx.recv())
    } else {
        rx.recv()
    };
    answer.unwrap_or_else(|_| {
        Err(Error::Disconnected {
            peer: "the prism runtime (it shut down while a call was waiting)".into(),
        })
    })
}
