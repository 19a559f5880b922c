//! Waiting for an answer that is about to come: poll for a short while
//! before sleeping.
//!
//! A synchronous call's answer reaches the waiting thread from another
//! thread of the process (the connection's reader, or the reader that
//! queued an actor call for the executor). When the waiting thread sleeps,
//! that hand-off costs a wake-up, and waking a thread whose core went idle
//! costs tens of microseconds on a virtual machine, as much as the round
//! trip itself. A thread that polls (yielding its core to any other
//! thread that wants it) for `Config::spin_wait_us` before it sleeps
//! takes an answer that arrives within that time with no wake-up at all;
//! one that arrives later costs that much polling more than before.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a waiting thread polls before it sleeps, in nanoseconds.
static SPIN_NANOS: AtomicU64 = AtomicU64::new(0);

/// Sets how long waiting threads of this process poll before sleeping.
pub(crate) fn set(spin: Duration) {
    let nanos = u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX);
    SPIN_NANOS.store(nanos, Ordering::Relaxed);
}

fn spin() -> Duration {
    Duration::from_nanos(SPIN_NANOS.load(Ordering::Relaxed))
}

/// Polls `ready` until it gives a value or `spin` has passed.
fn poll_for<T>(spin: Duration, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    if spin.is_zero() {
        return ready();
    }
    let start = Instant::now();
    loop {
        for _ in 0..32 {
            if let Some(v) = ready() {
                return Some(v);
            }
            // Yield rather than spin in place: on a machine with few cores
            // the thread that will answer may be waiting for this one's.
            std::thread::yield_now();
        }
        if start.elapsed() >= spin {
            return ready();
        }
    }
}

/// Wakes the thread that polls a future.
struct ThreadWaker {
    thread: Thread,
    woken: AtomicBool,
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Runs `fut` to completion on this thread, polling it again as soon as
/// it is woken: for the first `spin_wait_us` of each wait by watching a
/// flag, then asleep until woken. The caller must have entered a runtime
/// (`Handle::enter`) whose own threads drive its I/O and timers.
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    let waker = Arc::new(ThreadWaker {
        thread: std::thread::current(),
        woken: AtomicBool::new(false),
    });
    let as_waker = Waker::from(waker.clone());
    let mut cx = Context::from_waker(&as_waker);
    let mut fut = pin!(fut);
    let spin = spin();
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let woken = || waker.woken.swap(false, Ordering::Acquire).then_some(());
        if poll_for(spin, woken).is_none() {
            while !waker.woken.swap(false, Ordering::Acquire) {
                std::thread::park();
            }
        }
    }
}

/// The next item of `rx`: polled for `spin_wait_us`, then waited for.
/// `None` once every sender is gone.
pub(crate) fn recv<T>(rx: &Receiver<T>) -> Option<T> {
    let mut gone = false;
    let polled = poll_for(spin(), || match rx.try_recv() {
        Ok(item) => Some(Some(item)),
        Err(TryRecvError::Disconnected) => {
            gone = true;
            Some(None)
        }
        Err(TryRecvError::Empty) => None,
    });
    match polled {
        Some(item) => item,
        None if gone => None,
        None => rx.recv().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_future_woken_from_another_thread_completes_with_and_without_spinning() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let _entered = rt.enter();
        for spin in [Duration::ZERO, Duration::from_micros(50)] {
            set(spin);
            // Answers that come during the spin, and long after it.
            for delay in [Duration::ZERO, Duration::from_millis(5)] {
                let (tx, rx) = tokio::sync::oneshot::channel();
                rt.spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = tx.send(7);
                });
                assert_eq!(block_on(rx), Ok(7), "spin {spin:?}, delay {delay:?}");
            }
        }
        set(Duration::ZERO);
    }

    #[test]
    fn recv_takes_items_in_order_and_ends_when_the_senders_go() {
        set(Duration::from_micros(20));
        let (tx, rx) = std::sync::mpsc::channel();
        let sender = std::thread::spawn(move || {
            for i in 0..100 {
                tx.send(i).expect("the receiver lives");
                if i % 10 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        let got: Vec<i32> = std::iter::from_fn(|| recv(&rx)).collect();
        sender.join().expect("no panic");
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        set(Duration::ZERO);
    }
}
