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
//!
//! Polling pays only while a core is free for it. When the machine has
//! more runnable threads than cores (16 clients and their 16 workers on
//! 16 cores), a polling thread takes turns from threads that have work.
//! With `Config::spin_max_load_percent` set, a wait polls only while the
//! kernel's count of runnable threads is at most that percent of the
//! cores this process may use, sampled at most once a millisecond. The
//! count includes the polling threads themselves, which is why it is off
//! by default: on two cores it stopped polling that paid.

use std::future::Future;
use std::io::Read;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a waiting thread polls before it sleeps, in nanoseconds.
static SPIN_NANOS: AtomicU64 = AtomicU64::new(0);

/// Runnable threads, in percent of the cores, above which nobody polls;
/// 0 polls whatever the load.
static MAX_LOAD_PERCENT: AtomicU64 = AtomicU64::new(0);

/// Sets how long waiting threads of this process poll before sleeping,
/// and the load above which they sleep at once.
pub(crate) fn set(spin: Duration, max_load_percent: u64) {
    let nanos = u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX);
    SPIN_NANOS.store(nanos, Ordering::Relaxed);
    MAX_LOAD_PERCENT.store(max_load_percent, Ordering::Relaxed);
}

/// How long this wait may poll: `spin_wait_us`, or nothing while the
/// machine has no core to spare.
fn spin() -> Duration {
    let spin = Duration::from_nanos(SPIN_NANOS.load(Ordering::Relaxed));
    let limit = MAX_LOAD_PERCENT.load(Ordering::Relaxed);
    if spin.is_zero() || limit == 0 {
        return spin;
    }
    match load_percent() {
        Some(load) if load > limit => Duration::ZERO,
        _ => spin,
    }
}

/// The last sample of the load: milliseconds since [`epoch`] in the high
/// 40 bits, the load in percent of the cores in the low 24 (all ones when
/// it cannot be read).
static LOAD_SAMPLE: AtomicU64 = AtomicU64::new(0);
const LOAD_BITS: u32 = 24;
const LOAD_UNKNOWN: u64 = (1 << LOAD_BITS) - 1;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Runnable threads on the machine in percent of the cores this process
/// may use, sampled at most once a millisecond; `None` where the kernel
/// does not say (no `/proc`).
fn load_percent() -> Option<u64> {
    let now_ms = (epoch().elapsed().as_millis() as u64).saturating_add(1);
    let sample = LOAD_SAMPLE.load(Ordering::Relaxed);
    let load = if sample >> LOAD_BITS == now_ms {
        sample & LOAD_UNKNOWN
    } else {
        let load = read_load().map_or(LOAD_UNKNOWN, |l| l.min(LOAD_UNKNOWN - 1));
        LOAD_SAMPLE.store(now_ms << LOAD_BITS | load, Ordering::Relaxed);
        load
    };
    (load != LOAD_UNKNOWN).then_some(load)
}

fn read_load() -> Option<u64> {
    static CORES: OnceLock<u64> = OnceLock::new();
    let cores =
        *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    let mut text = [0u8; 128];
    let n = std::fs::File::open("/proc/loadavg")
        .and_then(|mut f| f.read(&mut text))
        .ok()?;
    Some((runnable(&text[..n])? * 100).div_ceil(cores))
}

/// The runnable threads in `/proc/loadavg`'s text: the number before the
/// `/` of its fourth field ("0.50 0.40 0.30 3/456 789").
fn runnable(text: &[u8]) -> Option<u64> {
    let field = std::str::from_utf8(text).ok()?.split_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
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
        for (spin, limit) in [
            (Duration::ZERO, 0),
            (Duration::from_micros(50), 0),
            (Duration::from_micros(50), 100),
            (Duration::from_micros(50), 1),
        ] {
            set(spin, limit);
            // Answers that come during the spin, and long after it.
            for delay in [Duration::ZERO, Duration::from_millis(5)] {
                let (tx, rx) = tokio::sync::oneshot::channel();
                rt.spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = tx.send(7);
                });
                assert_eq!(
                    block_on(rx),
                    Ok(7),
                    "spin {spin:?}, limit {limit}, delay {delay:?}"
                );
            }
        }
        set(Duration::ZERO, 0);
    }

    #[test]
    fn recv_takes_items_in_order_and_ends_when_the_senders_go() {
        set(Duration::from_micros(20), 100);
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
        set(Duration::ZERO, 0);
    }

    #[test]
    fn the_runnable_count_is_read_from_loadavgs_fourth_field() {
        assert_eq!(runnable(b"0.50 0.40 0.30 3/456 789\n"), Some(3));
        assert_eq!(runnable(b"12.00 9.1 8.0 33/1024 5"), Some(33));
        assert_eq!(runnable(b"0.50 0.40"), None);
        assert_eq!(runnable(b"0.50 0.40 0.30 x/456 789"), None);
    }

    #[test]
    fn no_polling_while_the_machine_is_loaded_beyond_the_limit() {
        // This machine's load, whatever it is, is above 1% of its cores
        // (this thread runs) and below a million percent.
        if load_percent().is_none() {
            return;
        }
        set(Duration::from_micros(50), 1);
        assert_eq!(spin(), Duration::ZERO);
        set(Duration::from_micros(50), 1_000_000);
        assert_eq!(spin(), Duration::from_micros(50));
        set(Duration::ZERO, 0);
    }
}
