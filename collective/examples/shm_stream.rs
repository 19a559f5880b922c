//! The machine's own ceiling for two processes streaming through shared
//! memory, with no Prism code in the way.
//!
//! ```text
//! cargo run --release -p prism-collective --example shm_stream -- [rounds] [runs]
//! ```
//!
//! Each run forks a second process. The two share one mapping holding two
//! 4 MiB rings, one per direction, and both at once copy 1 GiB from a 256
//! MiB buffer into their outgoing ring in 256 KiB chunks while copying what
//! arrives on the incoming ring into a second buffer, polling without
//! sleeping. This is the traffic of a world-2 ring all-reduce without the
//! reduction. Buffers and ring slots are 64-byte aligned, and the copies
//! are a plain 16-byte vector loop (the C library's `rep movsb` copies run
//! slower between processes on some CPUs, which is not what this measures).
//! Prints GB/s moved each way, per round
//! (default 3 rounds, 5 runs: one line per run, each run a fresh pair of
//! processes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const RING: usize = 4 << 20;
const CHUNK: usize = 256 << 10;
const BUFFER: usize = 256 << 20;
const PER_ROUND: usize = 1 << 30;
/// Ring control (head, tail) on its own page, then the data.
const CONTROL: usize = 4096;

/// A 64-byte-aligned buffer of `len` bytes, every page touched.
fn aligned(len: usize, fill: u8) -> Vec<[u8; 64]> {
    std::hint::black_box(vec![[fill; 64]; len / 64])
}

fn bytes(v: &mut [[u8; 64]]) -> &mut [u8] {
    v.as_flattened_mut()
}

/// Copies `src` into `dst` (same length, a multiple of 16) 16 bytes at a
/// time.
fn copy(dst: &mut [u8], src: &[u8]) {
    assert!(dst.len() == src.len() && src.len().is_multiple_of(16));
    #[cfg(target_arch = "x86_64")]
    for (d, s) in dst.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
        // SAFETY: both are 16 in-bounds bytes; SSE2 is part of x86-64.
        unsafe {
            let v = _mm_loadu_si128(s.as_ptr() as *const __m128i);
            _mm_storeu_si128(d.as_mut_ptr() as *mut __m128i, v);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

struct Ring {
    base: *mut u8,
}

impl Ring {
    fn head(&self) -> &AtomicU64 {
        // SAFETY: the control page is in the mapping and 8-byte aligned.
        unsafe { &*(self.base as *const AtomicU64) }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as for `head`, one cache line further.
        unsafe { &*(self.base.add(64) as *const AtomicU64) }
    }
    /// The chunk at stream position `at`, to fill (sender side).
    fn slot_mut(&mut self, at: usize) -> &mut [u8] {
        // SAFETY: `at % RING` plus a chunk stays in the data area, and the
        // sender owns a slot between the tail and head updates.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(CONTROL + at % RING), CHUNK) }
    }
    /// The chunk at stream position `at`, to drain (receiver side).
    fn slot(&self, at: usize) -> &[u8] {
        // SAFETY: as for `slot_mut`; the receiver owns it until the tail
        // moves past it.
        unsafe { std::slice::from_raw_parts(self.base.add(CONTROL + at % RING), CHUNK) }
    }
}

fn run(rounds: usize) -> Result<Vec<f64>, String> {
    let len = 2 * (CONTROL + RING);
    // SAFETY: a fresh shared anonymous mapping, unmapped when this process
    // exits.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    let ring = |i: usize| Ring {
        // SAFETY: inside the mapping.
        base: unsafe { (map as *mut u8).add(i * (CONTROL + RING)) },
    };
    // SAFETY: this process has one thread; the child only runs the loop
    // below and exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    let me = usize::from(child == 0);
    let (mut out, inbound) = (ring(me), ring(1 - me));
    let mut src = aligned(BUFFER, 7);
    let mut dst = aligned(BUFFER, 8);
    let (src, dst) = (bytes(&mut src), bytes(&mut dst));
    let mut rates = Vec::new();
    let mut done = 0usize;
    for _ in 0..rounds {
        let started = Instant::now();
        let (mut sent, mut got) = (0, 0);
        while sent < PER_ROUND || got < PER_ROUND {
            let free = RING - (done + sent - out.tail().load(Ordering::Acquire) as usize);
            if sent < PER_ROUND && free >= CHUNK {
                let from = sent % BUFFER;
                copy(out.slot_mut(done + sent), &src[from..from + CHUNK]);
                sent += CHUNK;
                out.head().store((done + sent) as u64, Ordering::Release);
            }
            let ready = inbound.head().load(Ordering::Acquire) as usize - (done + got);
            if got < PER_ROUND && ready >= CHUNK {
                let to = got % BUFFER;
                copy(&mut dst[to..to + CHUNK], inbound.slot(done + got));
                got += CHUNK;
                inbound.tail().store((done + got) as u64, Ordering::Release);
            }
        }
        done += PER_ROUND;
        rates.push(PER_ROUND as f64 / started.elapsed().as_secs_f64() / 1e9);
    }
    if child == 0 {
        std::process::exit(0);
    }
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    unsafe { libc::waitpid(child, &mut status, 0) };
    Ok(rates)
}

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .map_or(Ok(default), |v| v.parse::<usize>())
            .unwrap_or_else(|e| {
                eprintln!("shm_stream: argument {i}: {e} (usage: shm_stream [rounds] [runs])");
                std::process::exit(2)
            })
    };
    let (rounds, runs) = (arg(1, 3).max(1), arg(2, 5).max(1));
    println!("# GB/s each way, {rounds} rounds of 1 GiB per run");
    for _ in 0..runs {
        match run(rounds) {
            Ok(rates) => {
                let line: Vec<String> = rates.iter().map(|r| format!("{r:.2}")).collect();
                println!("{}", line.join(" "));
            }
            Err(e) => {
                eprintln!("shm_stream: {e}");
                std::process::exit(1);
            }
        }
    }
}
