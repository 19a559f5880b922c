//! How fast Prism recovers when a process is killed:
//!
//! - `task_retry_after_kill`: a task's worker is SIGKILLed while the task
//!   runs; the time from the kill until `get` returns the retried task's
//!   result (the retry itself returns at once).
//! - `actor_restart_after_kill`: an actor with `max_restarts = -1` has its
//!   process SIGKILLed; the time from the kill until a call answers again
//!   (the constructor does nothing).
//!
//! Each is measured `--runs` times (default 5) and printed as
//! `name_ms min median max`. `bench/ray/recovery_compare.sh` runs this and
//! the same measurement with Ray side by side.
//!
//! Run: `cargo run --release --example recovery [-- --runs N]`

use prism::ActorOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Writes its pid to `marker` and waits to be killed; once the marker
/// holds a pid (a retry), returns at once.
#[prism::remote]
fn hold(marker: String) -> u32 {
    let marker = Path::new(&marker);
    if marker.exists() {
        return std::process::id();
    }
    let _ = std::fs::write(marker, std::process::id().to_string());
    std::thread::sleep(Duration::from_secs(60));
    0
}

#[prism::actor]
struct Pinger;

#[prism::actor]
impl Pinger {
    fn new() -> Self {
        Pinger
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }

    fn ping(&self) -> u8 {
        1
    }
}

const LIMIT: Duration = Duration::from_secs(30);

fn sigkill(pid: u32) -> Result<(), String> {
    // SAFETY: kill(2) touches no memory of this process.
    let rc = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    if rc != 0 {
        return Err(format!(
            "cannot kill pid {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Waits (bounded) until the task has written its pid to `marker`.
fn running_pid(marker: &Path) -> Result<u32, String> {
    let deadline = Instant::now() + LIMIT;
    while Instant::now() < deadline {
        if let Some(pid) = std::fs::read_to_string(marker)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return Ok(pid);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(format!("the task did not start within {LIMIT:?}"))
}

fn task_retry(dir: &Path, run: usize) -> Result<Duration, String> {
    let marker: PathBuf = dir.join(format!("task-{run}"));
    let result = hold::remote(marker.display().to_string()).map_err(|e| e.to_string())?;
    let pid = running_pid(&marker)?;
    let killed = Instant::now();
    sigkill(pid)?;
    let answer = prism::get_timeout(&result, LIMIT).map_err(|e| e.to_string())?;
    let took = killed.elapsed();
    if answer == pid {
        return Err("the result came from the killed process".into());
    }
    Ok(took)
}

fn actor_restart(pinger: &prism::ActorHandle<Pinger>) -> Result<Duration, String> {
    let pid = prism::get(&pinger.pid().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let killed = Instant::now();
    sigkill(pid)?;
    // A call sent while the process is still dying may fail with
    // ActorUnavailable; the measurement is the first call that answers.
    let deadline = killed + LIMIT;
    loop {
        let call = pinger.ping().map_err(|e| e.to_string())?;
        match prism::get_timeout(&call, LIMIT) {
            Ok(_) => return Ok(killed.elapsed()),
            Err(prism::Error::ActorUnavailable { .. }) if Instant::now() < deadline => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name}_ms {:.1} {:.1} {:.1}",
        ms(samples[0]),
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1])
    );
}

fn parse_runs() -> Result<usize, String> {
    let mut args = std::env::args().skip(1);
    let mut runs = 5;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => {
                let n = args.next().ok_or("--runs needs a number")?;
                runs = n
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n > 0)
                    .ok_or(format!("--runs: {n:?} is not a positive count"))?;
            }
            other => return Err(format!("unknown argument {other:?}; expected --runs N")),
        }
    }
    Ok(runs)
}

fn main() -> Result<(), String> {
    let runs = parse_runs()?;
    prism::init(prism::Config::default().num_cpus(2)).map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("prism-recovery-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let outcome = (|| {
        let mut tasks = Vec::new();
        for run in 0..runs {
            tasks.push(task_retry(&dir, run)?);
        }
        summary("task_retry_after_kill", tasks);
        let pinger =
            Pinger::remote_with(ActorOptions::new().max_restarts(-1)).map_err(|e| e.to_string())?;
        prism::get(&pinger.ping().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        let mut restarts = Vec::new();
        for _ in 0..runs {
            restarts.push(actor_restart(&pinger)?);
        }
        summary("actor_restart_after_kill", restarts);
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    prism::shutdown();
    outcome
}
