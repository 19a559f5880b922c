//! Resuming an experiment whose driver died: a child driver runs the
//! search and is killed mid-trial; this process restores the experiment.
//! Finished trials are not run again; the cut one resumes from its
//! checkpoint.

use prism_tests::{kill, must, must_eventually, ClusterSpec};
use prism_tune::{grid, Mode, SearchSpace, TuneConfig, Tuner};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

const CHILD: &str = "PRISM_TUNE_RESTORE_CHILD";

#[derive(Serialize, Deserialize)]
struct Params {
    x: f64,
    steps: u32,
    dir: String,
}

/// Reports one step at a time with a checkpoint holding the step; the
/// trial at x = 0.6 hangs after its second step the first time it runs,
/// for the test to kill the driver there.
fn resumable(p: Params) -> Result<(), String> {
    let dir = PathBuf::from(&p.dir);
    let start = match prism_train::get_checkpoint().map_err(|e| e.to_string())? {
        Some(c) => {
            let text = std::fs::read_to_string(c.path().join("step")).map_err(|e| e.to_string())?;
            text.trim().parse::<u32>().map_err(|e| e.to_string())? + 1
        }
        None => 0,
    };
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("runs.log"))
        .map_err(|e| e.to_string())?;
    writeln!(log, "x={} start={start}", p.x).map_err(|e| e.to_string())?;
    for step in start..p.steps {
        let ckpt = dir.join(format!("ckpt-{}-{step}-{}", p.x, std::process::id()));
        std::fs::create_dir_all(&ckpt).map_err(|e| e.to_string())?;
        std::fs::write(ckpt.join("step"), step.to_string()).map_err(|e| e.to_string())?;
        let score = -(p.x - 0.3).powi(2);
        prism_train::report(
            serde_json::json!({ "score": score, "step": step }),
            Some(prism_train::Checkpoint::from_directory(&ckpt)),
        )
        .map_err(|e| e.to_string())?;
        if p.x == 0.6 && start == 0 && step == 1 {
            std::fs::write(dir.join("hanging"), "").map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_secs(60));
            return Err("the test did not kill the driver within 60 s".into());
        }
    }
    Ok(())
}

fn search(dir: &Path) -> Tuner {
    let space = SearchSpace::new()
        .set("x", grid([0.1, 0.3, 0.6]))
        .set("steps", 3)
        .set("dir", dir.display().to_string());
    Tuner::new(resumable, space)
        .tune_config(
            TuneConfig::new()
                .metric("score")
                .mode(Mode::Max)
                .max_concurrent_trials(1),
        )
        .run_config(prism_train::RunConfig::new("exp").storage_path(dir))
}

#[test]
fn an_experiment_whose_driver_died_resumes_where_it_stopped() {
    if let Some(dir) = std::env::var_os(CHILD) {
        // The child driver: runs the search until the parent kills it.
        ClusterSpec::new().cpus(2).start();
        let _ = search(Path::new(&dir)).fit();
        panic!("the search finished although its driver should have been killed");
    }
    let dir = std::env::temp_dir().join(format!("prism-tune-restore-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    must(
        std::fs::create_dir_all(&dir),
        "the test folder must be made",
    );
    let mut child = must(
        std::process::Command::new(must(std::env::current_exe(), "this test's binary"))
            .args([
                "--exact",
                "an_experiment_whose_driver_died_resumes_where_it_stopped",
                "--nocapture",
            ])
            .env(CHILD, &dir)
            .spawn(),
        "the child driver must start",
    );
    // A checkpoint counts once the row naming it is in result.json (the
    // folder is renamed into place just before): wait for that row.
    let results = dir.join("exp").join("trial_00002").join("result.json");
    must_eventually(
        "the third trial commits its second checkpoint and hangs",
        Duration::from_secs(60),
        || {
            dir.join("hanging").exists()
                && std::fs::read_to_string(&results)
                    .is_ok_and(|text| text.contains("checkpoint_000002"))
        },
    );
    kill(child.id());
    let _ = child.wait();

    ClusterSpec::new().cpus(2).start();
    let results = must(
        must(
            Tuner::restore(dir.join("exp"), resumable),
            "the experiment folder must be readable",
        )
        .fit(),
        "the restored experiment must run",
    );
    let runs = must(std::fs::read_to_string(dir.join("runs.log")), "runs.log");
    let runs: Vec<&str> = runs.lines().collect();
    assert_eq!(
        runs,
        vec![
            "x=0.1 start=0",
            "x=0.3 start=0",
            "x=0.6 start=0",
            "x=0.6 start=2"
        ],
        "finished trials must not run again, and the cut one must resume after its checkpoint"
    );
    assert_eq!(results.len(), 3);
    assert!(results.errors().is_empty(), "{:?}", results.errors());
    let steps: Vec<usize> = results
        .trials()
        .iter()
        .map(|t| t.metrics_history.len())
        .collect();
    assert_eq!(steps, vec![3, 3, 3], "every trial has its three reports");
    assert_eq!(
        must(results.get_best_result(), "a best trial").config["x"],
        0.3
    );
    let _ = std::fs::remove_dir_all(&dir);
}
