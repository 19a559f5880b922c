//! `prism_train` across nodes: the Trainer runs three workers on three
//! nodes (STRICT_SPREAD) that all-reduce and checkpoint; it survives a
//! worker node's death, resuming from its checkpoint on the node left
//! over; and a data pipeline runs its block tasks, a shuffle and a
//! streaming split's readers over several nodes.
//!
//! Real node processes on test hosts in network namespaces (10.77.0.x, one
//! per host), started through the `prism` command (the harness is in
//! `common/mod.rs`). Needs root for the namespaces (CI runs as root);
//! elsewhere each test says it was skipped and why.

mod common;

use common::{
    drive_in_background, drive_on_head, finished, fresh_marks, head_and_three, host_of,
    three_nodes, worker_start, DRIVER, MARKS,
};
use prism_tests::{must, must_become};
use std::path::PathBuf;
use std::time::Duration;

#[derive(serde::Serialize, serde::Deserialize)]
struct SpreadConfig {
    epochs: u32,
    /// A folder every host sees, where each rank writes its node.
    marks: String,
}

#[derive(serde::Serialize)]
struct SpreadMetrics {
    epoch: u32,
    rank_sum: f64,
}

/// A training error from an I/O error.
fn failed(e: std::io::Error) -> prism_train::TrainError {
    prism_train::TrainError::Metrics(e.to_string())
}

/// A training loop that all-reduces its rank and checkpoints each epoch.
fn spread_loop(config: SpreadConfig) -> Result<(), prism_train::TrainError> {
    let (ctx, group, node) = worker_start()?;
    let mark = PathBuf::from(&config.marks).join(format!("rank{}", ctx.world_rank()));
    std::fs::write(mark, node).map_err(failed)?;
    for epoch in 0..config.epochs {
        let mut x = [ctx.world_rank() as f64];
        group.all_reduce(&mut x, prism_train::collective::ReduceOp::Sum)?;
        let dir = std::env::temp_dir().join(format!(
            "prism-cli-spread-ckpt-{}-{epoch}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        std::fs::write(dir.join(format!("rank{}", ctx.world_rank())), "weights").map_err(failed)?;
        prism_train::report(
            SpreadMetrics {
                epoch,
                rank_sum: x[0],
            },
            Some(prism_train::Checkpoint::from_directory(&dir)),
        )?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// The training driver's part, run on the head by the test below.
fn train_over_nodes() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let base = std::env::temp_dir().join(format!("prism-cli-train-{}", std::process::id()));
    let marks = base.join("marks");
    must(std::fs::create_dir_all(&marks), "the marks folder");
    let config = SpreadConfig {
        epochs: 2,
        marks: marks.display().to_string(),
    };
    let result = prism_train::Trainer::new(spread_loop, config)
        .scaling_config(
            prism_train::ScalingConfig::new(3)
                .placement_strategy(prism::PlacementStrategy::StrictSpread),
        )
        .run_config(prism_train::RunConfig::new("spread").storage_path(base.join("runs")))
        .fit()
        .into_result();
    match result {
        Ok(r) => {
            let sum = r.metrics.as_ref().map(|m| m["rank_sum"].clone());
            println!("TRAINED rank_sum {sum:?}");
            let saved = r
                .checkpoint
                .as_ref()
                .is_some_and(|c| (0..3).all(|i| c.path().join(format!("rank{i}")).exists()));
            println!("CHECKPOINT holds every rank's file: {saved}");
        }
        Err(e) => println!("TRAIN failed: {e}"),
    }
    let nodes: std::collections::BTreeSet<String> = (0..3)
        .filter_map(|i| std::fs::read_to_string(marks.join(format!("rank{i}"))).ok())
        .collect();
    println!("WORKERS on {} nodes", nodes.len());
    let _ = std::fs::remove_dir_all(&base);
    prism::shutdown();
}

#[test]
fn the_trainer_runs_three_workers_on_three_nodes_with_a_checkpoint() {
    if std::env::var_os(DRIVER).is_some() {
        return train_over_nodes();
    }
    let Some((m, head)) = three_nodes("train", &[("PRISM_HEARTBEAT_PERIOD_MS", "200")]) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "the_trainer_runs_three_workers_on_three_nodes_with_a_checkpoint",
    );
    assert!(
        said.contains("TRAINED rank_sum Some(Number(3.0))"),
        "{said}"
    );
    assert!(
        said.contains("CHECKPOINT holds every rank's file: true"),
        "{said}"
    );
    assert!(said.contains("WORKERS on 3 nodes"), "{said}");
}

#[derive(serde::Serialize)]
struct SurviveMetrics {
    epoch: u32,
    total: f64,
}

/// Adds 1 per rank into a running total each epoch (2 per epoch with two
/// workers), checkpointing it; a restarted group resumes from the latest
/// checkpoint, so the final total is right only if no epoch was lost or
/// counted twice.
fn surviving_loop(config: SpreadConfig) -> Result<(), prism_train::TrainError> {
    let (ctx, group, node) = worker_start()?;
    std::fs::write(PathBuf::from(&config.marks).join(&node), "").map_err(failed)?;
    let (mut start, mut total) = (0, 0.0);
    if let Some(c) = prism_train::get_checkpoint()? {
        let saved = std::fs::read_to_string(c.path().join("state")).map_err(failed)?;
        let (epoch, sum) = saved.split_once(' ').unwrap_or(("0", "0"));
        start = epoch.parse::<u32>().unwrap_or(0) + 1;
        total = sum.parse().unwrap_or(0.0);
    }
    for epoch in start..config.epochs {
        let mut x = [1.0f64];
        group.all_reduce(&mut x, prism_train::collective::ReduceOp::Sum)?;
        total += x[0];
        std::thread::sleep(Duration::from_millis(100));
        let dir = std::env::temp_dir().join(format!(
            "prism-cli-survive-ckpt-{}-{epoch}-{}",
            std::process::id(),
            ctx.world_rank()
        ));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        std::fs::write(dir.join("state"), format!("{epoch} {total}")).map_err(failed)?;
        prism_train::report(
            SurviveMetrics { epoch, total },
            Some(prism_train::Checkpoint::from_directory(&dir)),
        )?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

const SURVIVE_EPOCHS: u32 = 40;

/// The driver's part: two workers on two of the three worker nodes, one
/// of which the test kills.
fn train_through_node_death() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let marks = std::env::var(MARKS).unwrap_or_default();
    let storage = PathBuf::from(&marks).with_extension("runs");
    let result = prism_train::Trainer::new(
        surviving_loop,
        SpreadConfig {
            epochs: SURVIVE_EPOCHS,
            marks,
        },
    )
    .scaling_config(prism_train::ScalingConfig::new(2).resources_per_worker("worker", 1.0))
    .run_config(
        prism_train::RunConfig::new("survive")
            .storage_path(&storage)
            .failure_config(prism_train::FailureConfig::new(3)),
    )
    .fit();
    let failures = result.num_failures;
    match result.into_result() {
        Ok(r) => {
            let total = r.metrics.as_ref().map(|m| m["total"].clone());
            println!("TRAINED total={total:?} failures={failures}");
        }
        Err(e) => println!("TRAIN failed after {failures} failures: {e}"),
    }
    let _ = std::fs::remove_dir_all(&storage);
    prism::shutdown();
}

#[test]
fn the_trainer_survives_a_worker_nodes_death_resuming_from_its_checkpoint() {
    if std::env::var_os(DRIVER).is_some() {
        return train_through_node_death();
    }
    let Some((m, head)) = head_and_three("survive", "worker") else {
        return;
    };
    let marks = fresh_marks("survive");
    let waiter = drive_in_background(
        &m,
        "the_trainer_survives_a_worker_nodes_death_resuming_from_its_checkpoint",
        &head,
        &marks,
    );
    // Both workers run, on two of the three worker nodes: after a few
    // epochs, one of those nodes dies.
    let first: Vec<String> = must_become("both workers start", Duration::from_secs(60), || {
        let names: Vec<String> = std::fs::read_dir(&marks)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        (names.len() == 2).then_some(names)
    });
    std::thread::sleep(Duration::from_millis(1500));
    prism_tests::kill(m.node_pid(host_of(&m, &first[0])));
    let said = finished(waiter);
    println!("{said}");
    let total = 2.0 * f64::from(SURVIVE_EPOCHS);
    assert!(
        said.contains(&format!("TRAINED total=Some(Number({total:?}))")),
        "every epoch counted once: {said}"
    );
    assert!(
        said.lines()
            .any(|l| l.starts_with("TRAINED") && !l.ends_with("failures=0")),
        "the group was restarted: {said}"
    );
    // The restarted group ran on the worker node that was left over.
    let nodes = std::fs::read_dir(&marks).map(|d| d.count()).unwrap_or(0);
    assert_eq!(nodes, 3, "the third worker node took over: {said}");
    let _ = std::fs::remove_dir_all(&marks);
    let _ = std::fs::remove_dir_all(marks.with_extension("runs"));
}

/// Adds the node each block task ran on, and spends a little CPU so that
/// the tasks outgrow one node.
fn tag_node(batch: prism_train::data::Batch) -> Result<prism_train::data::Batch, String> {
    std::thread::sleep(Duration::from_millis(20));
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .map_err(|e| e.to_string())?;
    let n = batch.num_rows();
    batch
        .with_column("node", prism_train::data::Column::Str(vec![node; n]))
        .map_err(|e| e.to_string())
}

/// Reads one split; returns its ids.
#[prism::remote]
fn read_split(split: prism_train::data::DataIterator) -> Result<Vec<i64>, String> {
    let mut ids = Vec::new();
    for batch in split.iter_batches(500, false).map_err(|e| e.to_string())? {
        ids.extend_from_slice(
            batch
                .map_err(|e| e.to_string())?
                .i64("id")
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(ids)
}

/// The driver's part: a pipeline whose block tasks run on several nodes,
/// a shuffle across them, and a split read by tasks elsewhere.
fn pipeline_over_nodes() {
    use prism_train::data::LazyDataset;
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let n = 40_000usize;
    let ds = must(
        LazyDataset::range(n).map_batches(tag_node, 1000),
        "a map_batches step",
    );
    let mut ids = Vec::new();
    let mut nodes = std::collections::BTreeSet::new();
    for batch in must(ds.iter_batches(700, false), "the pipeline starts") {
        let batch = must(batch, "a batch arrives");
        ids.extend_from_slice(must(batch.i64("id"), "an id column"));
        nodes.extend(must(batch.str("node"), "a node column").iter().cloned());
    }
    println!(
        "STREAMED in order: {}, block tasks on {} nodes",
        ids == (0..n as i64).collect::<Vec<_>>(),
        nodes.len()
    );
    let shuffled = LazyDataset::range(n).random_shuffle(3);
    let mut got: Vec<i64> = Vec::new();
    for batch in must(shuffled.iter_batches(1000, false), "the shuffle starts") {
        got.extend_from_slice(must(must(batch, "a shuffled batch").i64("id"), "ids"));
    }
    let moved = got != (0..n as i64).collect::<Vec<_>>();
    got.sort_unstable();
    println!(
        "SHUFFLED every row once: {}, moved: {moved}",
        got == (0..n as i64).collect::<Vec<_>>()
    );
    let splits = must(ds.streaming_split(2, true), "a streaming split");
    let readers: Vec<_> = splits
        .into_iter()
        .map(|s| must(read_split::remote(s), "a reader task"))
        .collect();
    let mut all: Vec<i64> = Vec::new();
    let mut counts = Vec::new();
    for r in &readers {
        let part = must(prism::get(r), "a split is read");
        counts.push(part.len());
        all.extend(part);
    }
    all.sort_unstable();
    println!(
        "SPLIT equal: {}, every row once: {}",
        counts[0] == counts[1],
        all == (0..n as i64).collect::<Vec<_>>()
    );
    prism::shutdown();
}

#[test]
fn a_data_pipeline_runs_its_blocks_shuffle_and_splits_over_nodes() {
    if std::env::var_os(DRIVER).is_some() {
        return pipeline_over_nodes();
    }
    let Some((m, head)) = three_nodes("data", &[]) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "a_data_pipeline_runs_its_blocks_shuffle_and_splits_over_nodes",
    );
    assert!(said.contains("STREAMED in order: true"), "{said}");
    assert!(
        !said.contains("block tasks on 1 nodes") && said.contains("block tasks on"),
        "{said}"
    );
    assert!(
        said.contains("SHUFFLED every row once: true, moved: true"),
        "{said}"
    );
    assert!(
        said.contains("SPLIT equal: true, every row once: true"),
        "{said}"
    );
}
