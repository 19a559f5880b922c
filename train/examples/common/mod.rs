//! What the training examples share: checkpoints of a tch model, their
//! command-line options, progress on the driver (a bar on a terminal, a
//! line every few epochs otherwise), and a summary table at the end.

use prism_train::{Checkpoint, Metrics, TrainResult};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

/// Builds the Trainer's `on_report` hook.
pub fn reporter(
    epochs: u64,
    samples_per_epoch: f64,
    keys: &'static [&'static str],
) -> impl FnMut(&Metrics) + Send + 'static {
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    move |m: &Metrics| {
        let done = m["training_iteration"].as_u64().unwrap_or(0);
        let secs = m["time_this_iter_s"].as_f64().unwrap_or(0.0).max(1e-9);
        let mut text = format!("epoch {done}/{epochs}");
        for key in keys {
            if let Some(v) = m.get(*key).and_then(|v| v.as_f64()) {
                text.push_str(&format!("  {key} {v:.4}"));
            }
        }
        text.push_str(&format!(
            "  {:.0} samples/s  {:.1} s",
            samples_per_epoch / secs,
            started.elapsed().as_secs_f64()
        ));
        let mut err = std::io::stderr().lock();
        if tty {
            let width = 24usize;
            let filled = (done as usize * width) / epochs.max(1) as usize;
            let bar = format!(
                "{}{}",
                "#".repeat(filled),
                ".".repeat(width - filled.min(width))
            );
            let _ = write!(err, "\r[{bar}] {text}\x1b[K");
            if done == epochs {
                let _ = writeln!(err);
            }
        } else if done == 1 || done == epochs || done.is_multiple_of((epochs / 10).max(1)) {
            let _ = writeln!(err, "{text}");
        }
    }
}

/// Prints the run's summary as a table.
pub fn summary(title: &str, result: &TrainResult, wall_s: f64, rows: &[(&str, String)]) {
    let mut table: Vec<(String, String)> = vec![
        ("wall time".into(), format!("{wall_s:.2} s")),
        ("reports".into(), result.metrics_history.len().to_string()),
        (
            "time per epoch".into(),
            format!(
                "{:.1} ms",
                1000.0 * wall_s / result.metrics_history.len().max(1) as f64
            ),
        ),
        ("worker failures".into(), result.num_failures.to_string()),
    ];
    table.extend(rows.iter().map(|(k, v)| (k.to_string(), v.clone())));
    if let Some(c) = &result.checkpoint {
        table.push(("latest checkpoint".into(), c.path().display().to_string()));
    }
    if let Some(c) = &result.best_checkpoint {
        table.push(("best checkpoint".into(), c.path().display().to_string()));
    }
    table.push(("run folder".into(), result.path.display().to_string()));
    let kw = table.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let vw = table
        .iter()
        .map(|(_, v)| v.len())
        .max()
        .unwrap_or(0)
        .max(title.len().saturating_sub(kw + 3));
    let line = format!("+{}+{}+", "-".repeat(kw + 2), "-".repeat(vw + 2));
    println!("{line}");
    println!("| {title:<w$} |", w = kw + vw + 3);
    println!("{line}");
    for (k, v) in &table {
        println!("| {k:<kw$} | {v:<vw$} |");
    }
    println!("{line}");
}

/// The value after `--name` on the command line, parsed.
pub fn arg<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String>
where
    T::Err: std::fmt::Display,
{
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == name) else {
        return Ok(None);
    };
    let value = args.get(i + 1).ok_or(format!("{name} needs a value"))?;
    value
        .parse()
        .map(Some)
        .map_err(|e| format!("{name} {value}: {e}"))
}

/// Errors of a training function.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Resumes from the run's latest checkpoint, if the worker group was
/// restarted: loads the weights into `vs` and the optimizer's state into
/// `opt`, and returns the epoch to start from (0 for a fresh run). The
/// optimizer's state matters: Adam's running averages started again from
/// zero make the first steps after a restart far too large.
pub fn resume(
    vs: &mut tch::nn::VarStore,
    opt: &mut prism_train::torch::Adam,
) -> Result<u32, BoxError> {
    let Some(checkpoint) = prism_train::get_checkpoint()? else {
        return Ok(0);
    };
    vs.load(checkpoint.path().join("model.safetensors"))?;
    opt.load(checkpoint.path())?;
    let done: u32 = std::fs::read_to_string(checkpoint.path().join("epoch"))?
        .trim()
        .parse()?;
    eprintln!(
        "resuming at epoch {} from the checkpoint in {} (the model and the optimizer's state \
         after epoch {done})",
        done + 1,
        checkpoint.path().display()
    );
    Ok(done + 1)
}

/// On rank 0, writes the weights, the optimizer's state and the finished
/// epoch into `folder` and returns it as the checkpoint to report; other
/// ranks report none (their replicas and optimizers are the same).
pub fn checkpoint(
    vs: &tch::nn::VarStore,
    opt: &prism_train::torch::Adam,
    epoch: u32,
    folder: &Path,
) -> Result<Option<Checkpoint>, BoxError> {
    if prism_train::get_context()?.world_rank() != 0 {
        return Ok(None);
    }
    std::fs::create_dir_all(folder)?;
    vs.save(folder.join("model.safetensors"))?;
    opt.save(folder)?;
    std::fs::write(folder.join("epoch"), epoch.to_string())?;
    Ok(Some(Checkpoint::from_directory(folder)))
}

/// Fails when `loss`, the final loss of a run that was restarted, is not
/// within 10% (or 0.002) of the final loss of the same run without a
/// restart, read from the file `reference` (as `--write-loss` wrote it).
#[allow(dead_code)] // Not every example that shares this module uses it.
pub fn check_against(loss: f64, reference: &Path) -> Result<(), BoxError> {
    let text = std::fs::read_to_string(reference)
        .map_err(|e| format!("--compare-loss {}: {e}", reference.display()))?;
    let unbroken: f64 = text
        .trim()
        .parse()
        .map_err(|e| format!("--compare-loss {}: {e}", reference.display()))?;
    let allowed = (unbroken.abs() * 0.1).max(0.002);
    if (loss - unbroken).abs() > allowed {
        return Err(format!(
            "final loss {loss:.5} after the restart, {unbroken:.5} without it: more than \
             {allowed:.5} apart"
        )
        .into());
    }
    eprintln!("final loss {loss:.5}, without the restart {unbroken:.5}: within {allowed:.5}");
    Ok(())
}
