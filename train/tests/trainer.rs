//! The Trainer through a real cluster: worker actors in a placement group,
//! a collective group formed through the control store, reports and
//! checkpoints in the run folder, and recovery from a killed worker.

use prism_train::collective::ReduceOp;
use prism_train::data::Dataset;
use prism_train::{
    CheckpointConfig, CheckpointScoreOrder, Device, FailureConfig, RunConfig, ScalingConfig,
    TrainError, Trainer,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn cluster() {
    prism::init(
        prism::Config::default()
            .num_cpus(4)
            .num_gpus(2)
            .ignore_reinit_error(true),
    )
    .expect("the embedded cluster must start");
}

fn storage(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prism-trainer-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("result.json holds JSON lines"))
        .collect()
}

#[derive(Serialize, Deserialize)]
struct BasicConfig {
    epochs: u32,
}

#[derive(Serialize)]
struct BasicMetrics {
    epoch: u32,
    rank_sum: f64,
    shard_rows: usize,
    score: f64,
    world_rank: usize,
    pid: u32,
}

fn basic_loop(config: BasicConfig) -> Result<(), TrainError> {
    let ctx = prism_train::get_context()?;
    let group = prism_train::get_process_group()?;
    let shard = prism_train::get_dataset_shard("train")?;
    for epoch in 0..config.epochs {
        let mut x = [ctx.world_rank() as f64];
        group.all_reduce(&mut x, ReduceOp::Sum)?;
        let rows = shard
            .iter_batches(8, false)?
            .map(|b| b.map(|b| b.num_rows()))
            .sum::<Result<usize, _>>()?;
        let dir = std::env::temp_dir().join(format!("basic-ckpt-{}-{}", std::process::id(), epoch));
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::Metrics(e.to_string()))?;
        std::fs::write(
            dir.join(format!("rank{}.txt", ctx.world_rank())),
            format!("{epoch}"),
        )
        .map_err(|e| TrainError::Metrics(e.to_string()))?;
        prism_train::report(
            BasicMetrics {
                epoch,
                rank_sum: x[0],
                shard_rows: rows,
                // Best at epoch 1: kept whatever its age.
                score: -((epoch as f64) - 1.0).abs(),
                world_rank: ctx.world_rank(),
                pid: std::process::id(),
            },
            Some(prism_train::Checkpoint::from_directory(&dir)),
        )?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

#[test]
fn a_run_reports_every_epoch_keeps_its_checkpoints_and_forms_a_group() {
    cluster();
    let root = storage("basic");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let hook_seen = seen.clone();
    let result = Trainer::new(basic_loop, BasicConfig { epochs: 4 })
        .scaling_config(ScalingConfig::new(3))
        .run_config(
            RunConfig::new("basic")
                .storage_path(&root)
                .checkpoint_config(
                    CheckpointConfig::new()
                        .num_to_keep(1)
                        .checkpoint_score_attribute("score", CheckpointScoreOrder::Max),
                ),
        )
        .dataset("train", Dataset::range(100))
        .on_report(move |m| {
            hook_seen
                .lock()
                .unwrap()
                .push(m["training_iteration"].clone())
        })
        .fit()
        .into_result()
        .expect("the run succeeds");
    let run = root.join("basic");
    assert_eq!(result.path, run);
    assert_eq!(result.metrics_history.len(), 4);
    let last = result.metrics.as_ref().unwrap();
    assert_eq!(last["rank_sum"], 3.0, "0 + 1 + 2 all-reduced");
    assert_eq!(last["shard_rows"], 33, "100 rows in 3 equal shards");
    assert_eq!(last["world_rank"], 0, "the driver keeps rank 0's metrics");
    assert_eq!(last["training_iteration"], 4);
    assert_eq!(seen.lock().unwrap().len(), 4, "the hook saw every report");
    let rows = lines(&run.join("result.json"));
    assert_eq!(rows.len(), 4);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["training_iteration"], i as u64 + 1);
        assert_eq!(
            row["checkpoint_dir_name"],
            format!("checkpoint_{:06}", i + 1)
        );
    }
    let csv = std::fs::read_to_string(run.join("progress.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "header and 4 rows: {csv}");
    assert!(csv.lines().next().unwrap().contains("training_iteration"));
    // num_to_keep 1 by score keeps the best (epoch 1 = iteration 2) and the latest.
    let mut dirs: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint_") || n.starts_with(".staging"))
        .collect();
    dirs.sort();
    assert_eq!(dirs, vec!["checkpoint_000002", "checkpoint_000004"]);
    assert_eq!(
        result.best_checkpoint.as_ref().unwrap().path(),
        run.join("checkpoint_000002")
    );
    assert_eq!(
        result.checkpoint.as_ref().unwrap().path(),
        run.join("checkpoint_000004")
    );
    for rank in 0..3 {
        let text =
            std::fs::read_to_string(run.join(format!("checkpoint_000004/rank{rank}.txt"))).unwrap();
        assert_eq!(
            text, "3",
            "every rank's files are merged into the checkpoint"
        );
    }
    assert!(run.join("params.json").exists());
    // The workers are gone and their resources are back.
    let (total, available) = prism::cluster_resources().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut available = available;
    while available.get("CPU") != total.get("CPU") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        available = prism::cluster_resources().unwrap().1;
    }
    assert_eq!(available.get("CPU"), total.get("CPU"));
    // The same storage path and name again resumes the run (its rows
    // stand; the workers get its latest checkpoint) instead of
    // overwriting it.
    let again = Trainer::new(basic_loop, BasicConfig { epochs: 1 })
        .scaling_config(ScalingConfig::new(3))
        .run_config(RunConfig::new("basic").storage_path(&root))
        .dataset("train", Dataset::range(100))
        .fit()
        .into_result()
        .expect("resumed");
    assert_eq!(
        again.metrics_history.len(),
        5,
        "4 earlier rows and 1 new one"
    );
    assert_eq!(again.metrics.unwrap()["training_iteration"], 5);
    assert_eq!(lines(&run.join("result.json")).len(), 5);
    std::fs::remove_dir_all(&root).unwrap();
}

/// Linear regression y = 3x - 1 by full-batch gradient descent, gradients
/// averaged over the workers; the model and epoch live in the checkpoint.
#[derive(Serialize, Deserialize)]
struct FitConfig {
    epochs: u32,
    pid_dir: PathBuf,
    sleep_ms: u64,
}

#[derive(Serialize)]
struct FitMetrics {
    epoch: u32,
    loss: f64,
    w: f64,
    b: f64,
}

fn regression_loop(config: FitConfig) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let ctx = prism_train::get_context()?;
    let group = prism_train::get_process_group()?;
    std::fs::create_dir_all(&config.pid_dir)?;
    std::fs::write(
        config.pid_dir.join(format!("rank{}", ctx.world_rank())),
        std::process::id().to_string(),
    )?;
    let (mut w, mut b, mut start) = (0.0f64, 0.0f64, 0u32);
    if let Some(ckpt) = prism_train::get_checkpoint()? {
        let text = std::fs::read_to_string(ckpt.path().join("model.txt"))?;
        let v: Vec<f64> = text
            .split_whitespace()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        (w, b, start) = (v[0], v[1], v[2] as u32);
    }
    let shard = prism_train::get_dataset_shard("train")?;
    let ckpt_dir = std::env::temp_dir().join(format!("regression-ckpt-{}", std::process::id()));
    for epoch in start..config.epochs {
        let (mut gw, mut gb, mut loss, mut n) = (0.0, 0.0, 0.0, 0.0);
        for batch in shard.iter_batches(16, false)? {
            let batch = batch?;
            for (&x, &y) in batch.f64("x")?.iter().zip(batch.f64("y")?) {
                let err = w * x + b - y;
                gw += 2.0 * err * x;
                gb += 2.0 * err;
                loss += err * err;
                n += 1.0;
            }
        }
        let mut g = [gw / n, gb / n, loss / n];
        group.all_reduce(&mut g, ReduceOp::Mean)?;
        w -= 0.1 * g[0];
        b -= 0.1 * g[1];
        std::thread::sleep(Duration::from_millis(config.sleep_ms));
        let checkpoint = if ctx.world_rank() == 0 {
            std::fs::create_dir_all(&ckpt_dir)?;
            std::fs::write(ckpt_dir.join("model.txt"), format!("{w} {b} {}", epoch + 1))?;
            Some(prism_train::Checkpoint::from_directory(&ckpt_dir))
        } else {
            None
        };
        prism_train::report(
            FitMetrics {
                epoch,
                loss: g[2],
                w,
                b,
            },
            checkpoint,
        )?;
    }
    Ok(())
}

/// One integer column of result.json's rows.
fn column(rows: &[serde_json::Value], key: &str) -> Vec<u64> {
    rows.iter().map(|r| r[key].as_u64().unwrap()).collect()
}

/// The last reported model (w, b) and loss of a run with `what` equal
/// those of a run without it.
fn assert_same_model(
    clean: &prism_train::TrainResult,
    other: &prism_train::TrainResult,
    what: &str,
) {
    let (a, b) = (
        clean.metrics.as_ref().unwrap(),
        other.metrics.as_ref().unwrap(),
    );
    for key in ["w", "b", "loss"] {
        let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        assert!(
            (x - y).abs() < 1e-9,
            "{key}: {x} without {what}, {y} with it"
        );
    }
}

fn regression_data() -> Dataset {
    #[derive(Serialize)]
    struct Row {
        x: f64,
        y: f64,
    }
    Dataset::from_items((0..64).map(|i| {
        let x = i as f64 / 64.0;
        Row {
            x,
            y: 3.0 * x - 1.0,
        }
    }))
    .unwrap()
}

fn regression(name: &str, root: &Path, sleep_ms: u64, max_failures: usize) -> Trainer {
    Trainer::new(
        regression_loop,
        FitConfig {
            epochs: 12,
            pid_dir: root.join(format!("{name}-pids")),
            sleep_ms,
        },
    )
    .scaling_config(ScalingConfig::new(2))
    .run_config(
        RunConfig::new(name)
            .storage_path(root)
            .checkpoint_config(CheckpointConfig::new().num_to_keep(2))
            .failure_config(FailureConfig::new(max_failures)),
    )
    .dataset("train", regression_data())
}

#[test]
fn a_killed_worker_is_replaced_and_the_run_resumes_from_its_checkpoint() {
    cluster();
    let root = storage("recovery");
    let clean = regression("clean", &root, 0, 0)
        .fit()
        .into_result()
        .expect("clean run");
    let killer_root = root.clone();
    let killer = std::thread::spawn(move || {
        // Once a few epochs are in, SIGKILL rank 1's process.
        let results = killer_root.join("killed/result.json");
        let deadline = Instant::now() + Duration::from_secs(60);
        while lines(&results).len() < 4 {
            assert!(Instant::now() < deadline, "the run never reached epoch 4");
            std::thread::sleep(Duration::from_millis(10));
        }
        let pid: i32 = std::fs::read_to_string(killer_root.join("killed-pids/rank1"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        pid
    });
    let result = regression("killed", &root, 60, 2).fit();
    let killed_pid = killer.join().unwrap();
    let result = result.into_result().expect("the run survives one failure");
    assert_eq!(result.num_failures, 1);
    let new_pid: i32 = std::fs::read_to_string(root.join("killed-pids/rank1"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(new_pid, killed_pid, "rank 1 runs in a new process");
    let rows = lines(&root.join("killed/result.json"));
    assert_eq!(
        column(&rows, "training_iteration"),
        (1..=12).collect::<Vec<_>>(),
        "no report lost or duplicated"
    );
    assert_eq!(column(&rows, "epoch"), (0..12).collect::<Vec<_>>());
    assert_same_model(&clean, &result, "a worker failure");
    std::fs::remove_dir_all(&root).unwrap();
}

/// Not a test of its own: the driver process of
/// `a_driver_that_dies_is_resumed_by_making_the_trainer_again`, started as
/// a copy of this test binary with PRISM_TEST_DRIVER_ROOT set.
#[test]
fn driver_process() {
    let Some(root) = std::env::var_os("PRISM_TEST_DRIVER_ROOT") else {
        return;
    };
    cluster();
    let root = PathBuf::from(root);
    let result = regression("driver", &root, 60, 0).fit();
    println!("driver finished: {:?}", result.error);
}

#[test]
fn a_driver_that_dies_is_resumed_by_making_the_trainer_again() {
    let root = storage("driver");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "driver_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PRISM_TEST_DRIVER_ROOT", &root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the test binary starts a driver");
    let results = root.join("driver/result.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    while lines(&results).len() < 5 {
        assert!(
            Instant::now() < deadline,
            "the driver never reached epoch 5"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the driver ended early"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The driver dies with its embedded cluster; its workers follow.
    child.kill().unwrap();
    child.wait().unwrap();
    cluster();
    let clean = regression("driver-clean", &root, 0, 0)
        .fit()
        .into_result()
        .expect("clean run");
    let resumed = regression("driver", &root, 0, 0)
        .fit()
        .into_result()
        .expect("the same Trainer again resumes the run");
    let rows = lines(&results);
    assert_eq!(
        column(&rows, "training_iteration"),
        (1..=12).collect::<Vec<_>>(),
        "no report lost or duplicated"
    );
    assert_eq!(resumed.metrics_history.len(), 12);
    assert_same_model(&clean, &resumed, "the driver's crash");
    std::fs::remove_dir_all(&root).unwrap();
}

fn failing_loop(rank_to_fail: usize) -> Result<(), String> {
    let ctx = prism_train::get_context().map_err(|e| e.to_string())?;
    if ctx.world_rank() == rank_to_fail {
        return Err(format!("rank {rank_to_fail} cannot go on"));
    }
    // The others wait for the failed rank in a collective (for minutes,
    // the collective timeout): the driver must not wait for them.
    let group = prism_train::get_process_group().map_err(|e| e.to_string())?;
    group.barrier().map_err(|e| e.to_string())?;
    prism_train::report(serde_json::json!({"ok": 1}), None).map_err(|e| e.to_string())
}

#[test]
fn a_run_that_keeps_failing_stops_after_max_failures_with_the_cause() {
    cluster();
    let root = storage("failing");
    let started = Instant::now();
    let result = Trainer::new(failing_loop, 1usize)
        .scaling_config(ScalingConfig::new(2))
        .run_config(
            RunConfig::new("failing")
                .storage_path(&root)
                .failure_config(FailureConfig::new(1)),
        )
        .fit();
    assert_eq!(result.num_failures, 2);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the first failure ends each attempt at once, not at the collective timeout"
    );
    match &result.error {
        Some(TrainError::TrainingFailed {
            failures: 2,
            max_failures: 1,
            cause,
        }) => {
            let text = cause.to_string();
            assert!(text.contains("rank 1 cannot go on"), "{text}");
        }
        other => panic!("expected TrainingFailed, got {other:?}"),
    }
    std::fs::remove_dir_all(&root).unwrap();
}

fn gpu_loop(_: ()) -> Result<(), TrainError> {
    let ctx = prism_train::get_context()?;
    assert_eq!(ctx.device(), Device::Cuda(0));
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
    prism_train::report(
        serde_json::json!({"gpu": visible, "local_rank": ctx.local_rank()}),
        None,
    )
}

#[test]
fn gpu_workers_each_see_their_own_device_and_bad_settings_are_named() {
    cluster();
    let root = storage("gpu");
    // The cluster declares 2 GPUs (no CUDA needed to schedule them).
    let result = Trainer::new(gpu_loop, ())
        .scaling_config(ScalingConfig::new(2).use_gpu(true))
        .run_config(RunConfig::new("gpu").storage_path(&root))
        .fit()
        .into_result()
        .expect("gpu run");
    assert_eq!(result.metrics.unwrap()["gpu"].as_str().unwrap().len(), 1);
    let err = Trainer::new(gpu_loop, ())
        .scaling_config(ScalingConfig::new(3).use_gpu(true))
        .run_config(RunConfig::new("too-many").storage_path(&root))
        .fit()
        .error
        .expect("3 GPUs on a 2-GPU cluster");
    assert!(
        err.to_string().contains("no node can ever satisfy"),
        "{err}"
    );
    let err = Trainer::new(gpu_loop, ())
        .scaling_config(ScalingConfig::new(0))
        .fit()
        .error
        .unwrap();
    assert!(
        matches!(
            err,
            TrainError::InvalidConfig {
                field: "ScalingConfig::num_workers",
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        prism_train::get_context(),
        Err(TrainError::NotInWorker(_))
    ));
    std::fs::remove_dir_all(&root).unwrap();
}

fn uneven_loop(_: ()) -> Result<(), TrainError> {
    let ctx = prism_train::get_context()?;
    for _ in 0..ctx.world_rank() + 1 {
        prism_train::report(serde_json::json!({"x": 1}), None)?;
    }
    Ok(())
}

#[test]
fn workers_that_report_unequally_fail_the_run_with_a_clear_error() {
    cluster();
    let root = storage("uneven");
    let err = Trainer::new(uneven_loop, ())
        .scaling_config(ScalingConfig::new(2))
        .run_config(RunConfig::new("uneven").storage_path(&root))
        .fit()
        .error
        .expect("unequal reports");
    assert!(err.to_string().contains("same number of times"), "{err}");
    std::fs::remove_dir_all(&root).unwrap();
}

fn add_double(batch: prism_train::data::Batch) -> Result<prism_train::data::Batch, String> {
    let doubled = batch
        .i64("id")
        .map_err(|e| e.to_string())?
        .iter()
        .map(|v| *v as f64 * 2.0)
        .collect();
    batch
        .with_column("double", prism_train::data::Column::F64(doubled))
        .map_err(|e| e.to_string())
}

fn streaming_loop(epochs: u32) -> Result<(), TrainError> {
    let shard = prism_train::get_dataset_shard("train")?;
    for epoch in 0..epochs {
        let (mut rows, mut sum) = (0usize, 0.0);
        for batch in shard.iter_batches(100, false)? {
            let batch = batch?;
            rows += batch.num_rows();
            sum += batch.f64("double")?.iter().sum::<f64>();
        }
        prism_train::report(
            serde_json::json!({"epoch": epoch, "rows": rows, "sum": sum, "streaming": shard.is_streaming()}),
            None,
        )?;
    }
    Ok(())
}

#[test]
fn a_lazy_dataset_streams_to_the_workers_each_epoch_in_equal_shares() {
    cluster();
    let root = storage("streaming");
    // Made by the pipeline's tasks while the workers read: 20,001 rows in
    // blocks of 8,192, of which each of 2 workers gets 10,000 per epoch.
    let data = prism_train::data::LazyDataset::range(20_001)
        .map_batches(add_double, 1000)
        .unwrap();
    let result = Trainer::new(streaming_loop, 3u32)
        .scaling_config(ScalingConfig::new(2))
        .run_config(RunConfig::new("streaming").storage_path(&root))
        .dataset("train", data)
        .fit()
        .into_result()
        .expect("the run succeeds");
    assert_eq!(result.metrics_history.len(), 3, "one report per epoch");
    for m in &result.metrics_history {
        assert_eq!(m["rows"], 10_000, "{m:?}");
        assert_eq!(m["streaming"], true);
    }
    std::fs::remove_dir_all(&root).unwrap();
}
