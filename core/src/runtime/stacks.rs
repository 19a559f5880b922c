//! Every thread's stack of this process, taken while it runs (`prism
//! stack`, Ray's `ray stack`): each thread in turn is sent a signal whose
//! handler walks the thread's own stack (libgcc's unwinder, which finds
//! each frame's unwind table without a lock on glibc 2.35 and later) and
//! writes the return addresses to a static buffer; the dumping thread
//! then names them from the binary's debug info. A thread stops only for
//! its own walk (microseconds); one that does not answer in time (it
//! blocks the signal, or sleeps uninterruptibly in the kernel) is named
//! with its state and no frames.
//!
//! Linux only (the thread list is `/proc/self/task`); elsewhere the dump
//! says so.

use serde::Serialize;

/// One frame, named.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Frame {
    /// The function (demangled, without its hash), if known.
    pub(crate) function: Option<String>,
    /// Its source file and line, when the binary has line tables.
    pub(crate) file: Option<String>,
    /// The line.
    pub(crate) line: Option<u32>,
    /// The address.
    pub(crate) address: String,
}

/// One thread of the process.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Thread {
    /// Its id (the kernel's).
    pub(crate) tid: u32,
    /// Its name.
    pub(crate) name: String,
    /// Its state as the kernel tells it (`R` running, `S` sleeping, ...).
    pub(crate) state: String,
    /// Its frames, innermost first.
    pub(crate) frames: Vec<Frame>,
    /// Why there are no frames, if there are none.
    pub(crate) note: Option<String>,
}

/// How long a thread has to answer.
#[cfg(target_os = "linux")]
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_millis(200);

/// Every thread's stack but the calling one's.
pub(crate) fn dump() -> Vec<Thread> {
    imp::dump()
}

#[cfg(not(target_os = "linux"))]
mod imp {
    pub(super) fn dump() -> Vec<super::Thread> {
        vec![super::Thread {
            tid: 0,
            name: String::new(),
            state: String::new(),
            frames: Vec::new(),
            note: Some("stack dumps are taken on Linux only".into()),
        }]
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use super::{Frame, Thread, ANSWER_WITHIN};
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::Instant;

    const MAX_FRAMES: usize = 128;
    /// Set in `TARGET` by the handler while it writes `FRAMES`.
    const BUSY: u64 = 1 << 31;
    const TID_MASK: u64 = BUSY - 1;

    /// The thread asked to walk its stack now: `(generation << 32) | tid`,
    /// with `BUSY` while it writes; 0 when none is.
    static TARGET: AtomicU64 = AtomicU64::new(0);
    /// The generation whose walk is written.
    static DONE: AtomicU64 = AtomicU64::new(0);
    static DEPTH: AtomicUsize = AtomicUsize::new(0);
    static FRAMES: [AtomicUsize; MAX_FRAMES] = [const { AtomicUsize::new(0) }; MAX_FRAMES];
    /// One dump at a time, and the generation counter.
    static DUMPS: parking_lot::Mutex<u64> = parking_lot::Mutex::new(0);
    static INSTALLED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();

    fn signal() -> libc::c_int {
        libc::SIGRTMIN() + 5
    }

    fn gettid() -> u64 {
        // SAFETY: gettid has no preconditions and is async-signal-safe.
        unsafe { libc::syscall(libc::SYS_gettid) as u64 }
    }

    /// The handler: walks this thread's stack if it is the one asked.
    /// Async-signal-safe: atomics, and the unwinder, which takes no lock
    /// with glibc's `_dl_find_object`; no allocation.
    extern "C" fn on_signal(_: libc::c_int) {
        let target = TARGET.load(Ordering::Acquire);
        if target == 0 || target & BUSY != 0 || target & TID_MASK != gettid() {
            return;
        }
        if TARGET
            .compare_exchange(target, target | BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let mut n = 0;
        // SAFETY: the walk reads this thread's own stack; nothing else
        // walks with this buffer while `TARGET` holds `BUSY`.
        unsafe {
            backtrace::trace_unsynchronized(|frame| {
                if n >= MAX_FRAMES {
                    return false;
                }
                FRAMES[n].store(frame.ip() as usize, Ordering::Relaxed);
                n += 1;
                true
            });
        }
        DEPTH.store(n, Ordering::Relaxed);
        DONE.store(target >> 32, Ordering::Release);
        TARGET.store(0, Ordering::Release);
    }

    fn install() -> Result<(), String> {
        INSTALLED
            .get_or_init(|| {
                // SAFETY: a zeroed sigaction is a valid start; the handler
                // is async-signal-safe (see `on_signal`).
                unsafe {
                    let mut action: libc::sigaction = std::mem::zeroed();
                    action.sa_sigaction = on_signal as *const () as usize;
                    action.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut action.sa_mask);
                    if libc::sigaction(signal(), &action, std::ptr::null_mut()) != 0 {
                        return Err(format!(
                            "cannot install the stack-dump signal handler: {}",
                            std::io::Error::last_os_error()
                        ));
                    }
                }
                Ok(())
            })
            .clone()
    }

    /// The return addresses of thread `tid`, or why there are none.
    fn walk(generation: u64, tid: u64) -> Result<Vec<usize>, String> {
        let asked = (generation << 32) | tid;
        TARGET.store(asked, Ordering::Release);
        // SAFETY: tgkill to a thread of this process, with a signal whose
        // handler is installed.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                tid as libc::pid_t,
                signal(),
            )
        };
        if sent != 0 {
            TARGET.store(0, Ordering::Release);
            return Err(format!(
                "it could not be signalled: {}",
                std::io::Error::last_os_error()
            ));
        }
        let start = Instant::now();
        loop {
            if DONE.load(Ordering::Acquire) == generation {
                let depth = DEPTH.load(Ordering::Relaxed).min(MAX_FRAMES);
                return Ok((0..depth)
                    .map(|i| FRAMES[i].load(Ordering::Relaxed))
                    .collect());
            }
            if start.elapsed() > ANSWER_WITHIN {
                // Withdrawn unless its handler is writing now; then it
                // ends in a moment.
                if TARGET
                    .compare_exchange(asked, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Err(format!(
                        "it did not answer within {} ms (it blocks the signal, or waits in \
                         the kernel)",
                        ANSWER_WITHIN.as_millis()
                    ));
                }
            }
            if start.elapsed() > ANSWER_WITHIN * 10 {
                return Err("its walk did not end".into());
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Names the addresses of a walk, leaving out the walk itself (the
    /// frames up to the signal's return trampoline).
    fn name(addresses: &[usize]) -> Vec<Frame> {
        let mut frames: Vec<(usize, Frame)> = Vec::with_capacity(addresses.len());
        for (i, &ip) in addresses.iter().enumerate() {
            // A return address points after its call: look it up one
            // byte back, except for the interrupted frame (checked below).
            let lookup = if i == 0 { ip } else { ip.saturating_sub(1) };
            let mut frame = Frame {
                function: None,
                file: None,
                line: None,
                address: format!("{ip:#x}"),
            };
            backtrace::resolve(lookup as *mut std::ffi::c_void, |symbol| {
                if frame.function.is_none() {
                    frame.function = symbol.name().map(|n| format!("{n:#}"));
                    frame.file = symbol.filename().map(|f| f.display().to_string());
                    frame.line = symbol.lineno();
                }
            });
            frames.push((ip, frame));
        }
        let handler = frames.iter().position(|(_, f)| {
            f.function
                .as_deref()
                .is_some_and(|n| n.ends_with("stacks::imp::on_signal"))
        });
        match handler {
            // The handler, then the trampoline the kernel returns through.
            Some(at) => frames.into_iter().skip(at + 2).map(|(_, f)| f).collect(),
            None => frames.into_iter().map(|(_, f)| f).collect(),
        }
    }

    fn read_task(tid: u64, file: &str) -> String {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/{file}")).unwrap_or_default()
    }

    /// The state letter and its meaning, from `/proc/self/task/<tid>/stat`.
    fn state(tid: u64) -> String {
        let stat = read_task(tid, "stat");
        let letter = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?");
        let meaning = match letter {
            "R" => "running",
            "S" => "sleeping",
            "D" => "waiting in the kernel",
            "T" | "t" => "stopped",
            "Z" => "zombie",
            _ => "",
        };
        format!("{letter} ({meaning})")
    }

    pub(super) fn dump() -> Vec<Thread> {
        if let Err(e) = install() {
            return vec![Thread {
                tid: 0,
                name: String::new(),
                state: String::new(),
                frames: Vec::new(),
                note: Some(e),
            }];
        }
        let me = gettid();
        let mut tids: Vec<u64> = std::fs::read_dir("/proc/self/task")
            .map(|dir| {
                dir.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        tids.sort_unstable();
        let mut generation = DUMPS.lock();
        let mut walks = Vec::with_capacity(tids.len());
        for tid in tids {
            if tid == me {
                continue;
            }
            *generation += 1;
            walks.push((tid, walk(*generation, tid)));
        }
        drop(generation);
        walks
            .into_iter()
            .map(|(tid, walked)| {
                let (frames, note) = match walked {
                    Ok(addresses) => (name(&addresses), None),
                    Err(why) => (Vec::new(), Some(why)),
                };
                Thread {
                    tid: tid as u32,
                    name: read_task(tid, "comm").trim().to_string(),
                    state: state(tid),
                    frames,
                    note,
                }
            })
            .collect()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[inline(never)]
    fn parked_in_a_known_function(
        ready: std::sync::mpsc::Sender<()>,
        stop: std::sync::mpsc::Receiver<()>,
    ) {
        let _ = ready.send(());
        let _ = stop.recv();
    }

    #[test]
    fn a_dump_finds_a_thread_parked_in_a_known_function_and_it_goes_on() {
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let (stop, stop_rx) = std::sync::mpsc::channel();
        let parked = std::thread::Builder::new()
            .name("parked".into())
            .spawn(move || {
                parked_in_a_known_function(ready_tx, stop_rx);
                7
            })
            .expect("a thread");
        ready.recv().expect("it parked");
        let threads = dump();
        let found = threads
            .iter()
            .find(|t| t.name == "parked")
            .unwrap_or_else(|| panic!("the parked thread is listed: {threads:?}"));
        assert!(
            found.frames.iter().any(|f| f
                .function
                .as_deref()
                .is_some_and(|n| n.contains("parked_in_a_known_function"))),
            "{found:?}"
        );
        assert!(
            !found.frames.iter().any(|f| f
                .function
                .as_deref()
                .is_some_and(|n| n.contains("on_signal"))),
            "the walk itself is left out: {found:?}"
        );
        stop.send(()).expect("it is waiting");
        assert_eq!(parked.join().expect("it ends"), 7, "it went on");
        // A second dump works as the first.
        assert!(!dump().is_empty());
    }
}
