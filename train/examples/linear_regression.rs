//! Ray Train's linear-regression example, in Rust: a 1→32→1 MLP learns
//! y = 2x + 1 on x = 0..200, data-parallel on 3 workers.
//!
//! Settings as in the Ray example: Linear(1, 32), ReLU, Linear(32, 1);
//! Adam, lr 0.01, weight decay 0.01; MSE loss; batch size 32; 200 epochs;
//! a report with a checkpoint every epoch, `num_to_keep` 1. It ends by
//! checking that the final loss is at most 0.09 (it exits with an error
//! otherwise).
//!
//! ```text
//! bash scripts/setup-torch.sh && . ~/.cache/prism/torch-2.11.0/prism-torch.env
//! cargo run --release -p prism-train --features tch --example linear_regression
//! ```
//!
//! Options: `--workers N`, `--epochs N`, `--storage DIR`, `--seed N` (the
//! initial weights; default 42), `--crash-at EPOCH` (the last worker's
//! process aborts at that epoch; the Trainer restarts the group from the
//! latest checkpoint, which holds the model and Adam's state, up to 2
//! failures, and the run ends as without it), `--write-loss FILE` (writes
//! the final loss there), `--compare-loss FILE` (fails unless the final
//! loss is within 10% of the one in FILE: a run with `--crash-at` against
//! the same run without),
//! `--use-gpu` (as the Ray example's `use_gpu = True`: the workers share
//! GPU 0, the model and batches live on it, and the gradients are averaged
//! there).

#[path = "common/mod.rs"]
mod common;

use prism_train::data::Dataset;
use prism_train::torch::{iter_torch_batches, prepare_model, Adam, AdamConfig, DdpOptions};
use prism_train::{CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, Trainer};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;
use tch::nn::{self, Module};
use tch::Kind;

use common::BoxError;

#[derive(Serialize, Deserialize)]
struct Config {
    epochs: u32,
    batch_size: usize,
    lr: f64,
    weight_decay: f64,
    hidden: i64,
    seed: i64,
    /// Crash the last worker's process at this epoch (first attempt only).
    crash_at: Option<u32>,
}

#[derive(Serialize)]
struct EpochMetrics {
    epoch: u32,
    loss: f64,
}

fn model(vs: &nn::Path, hidden: i64) -> nn::Sequential {
    nn::seq()
        .add(nn::linear(vs / "layer1", 1, hidden, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs / "layer2", hidden, 1, Default::default()))
}

/// Runs on every worker.
fn train_loop_per_worker(config: Config) -> Result<(), BoxError> {
    // One intra-op thread per worker, as Ray sets OMP_NUM_THREADS=1.
    tch::set_num_threads(1);
    let shard = prism_train::get_dataset_shard("train")?;
    // Rank 0's initial weights reach every worker through prepare_model.
    tch::manual_seed(config.seed);
    let device = prism_train::torch::get_device()?;
    let mut vs = nn::VarStore::new(device);
    let net = model(&vs.root(), config.hidden);
    let ddp = prepare_model(&mut vs, DdpOptions::default())?;
    let mut opt = Adam::new(
        &vs,
        config.lr,
        AdamConfig {
            weight_decay: config.weight_decay,
            ..AdamConfig::default()
        },
    );
    let start = common::resume(&mut vs, &mut opt)?;
    let staging = std::env::temp_dir().join(format!("linear-regression-{}", std::process::id()));
    let crash_here = start == 0 && {
        let ctx = prism_train::get_context()?;
        ctx.world_rank() + 1 == ctx.world_size()
    };
    for epoch in start..config.epochs {
        if crash_here && config.crash_at == Some(epoch) {
            eprintln!("crashing on purpose at epoch {epoch} (--crash-at)");
            std::process::abort();
        }
        let mut loss_value = f64::NAN;
        for batch in iter_torch_batches(&shard, config.batch_size, false, device)? {
            let batch = batch?;
            let x = batch["x"].to_kind(Kind::Float).unsqueeze(1);
            let y = batch["y"].to_kind(Kind::Float).unsqueeze(1);
            let loss = net.forward(&x).mse_loss(&y, tch::Reduction::Mean);
            opt.zero_grad();
            loss.backward();
            ddp.all_reduce_gradients()?;
            opt.step();
            loss_value = loss.to_kind(Kind::Double).double_value(&[]);
        }
        let checkpoint = common::checkpoint(&vs, &opt, epoch, &staging)?;
        prism_train::report(
            EpochMetrics {
                epoch,
                loss: loss_value,
            },
            checkpoint,
        )?;
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workers: usize = common::arg("--workers")?.unwrap_or(3);
    let epochs: u32 = common::arg("--epochs")?.unwrap_or(200);
    let storage = common::arg::<PathBuf>("--storage")?
        .unwrap_or_else(|| std::env::temp_dir().join("prism_results"));
    let use_gpu = std::env::args().any(|a| a == "--use-gpu");
    let started = Instant::now();
    let mut cluster = prism::Config::default().num_cpus(workers.max(2) as u32);
    if use_gpu {
        cluster = cluster.num_gpus(1);
    }
    prism::init(cluster)?;

    #[derive(Serialize)]
    struct Row {
        x: f64,
        y: f64,
    }
    let train = Dataset::from_items((0..200).map(|x| Row {
        x: x as f64,
        y: 2.0 * x as f64 + 1.0,
    }))?;
    let seed: i64 = common::arg("--seed")?.unwrap_or(42);
    let config = Config {
        epochs,
        batch_size: 32,
        lr: 0.01,
        weight_decay: 0.01,
        hidden: 32,
        seed,
        crash_at: common::arg("--crash-at")?,
    };
    let name = format!("linear_regression_{}", std::process::id());
    let samples = (200 / workers * workers) as f64;
    let mut scaling = ScalingConfig::new(workers);
    if use_gpu {
        // The workers share the one GPU.
        scaling = scaling
            .use_gpu(true)
            .resources_per_worker("GPU", 1.0 / workers as f64);
    }
    let result = Trainer::new(train_loop_per_worker, config)
        .scaling_config(scaling)
        .run_config(
            RunConfig::new(name)
                .storage_path(&storage)
                .checkpoint_config(CheckpointConfig::new().num_to_keep(1))
                .failure_config(FailureConfig::new(2)),
        )
        .dataset("train", train)
        .on_report(common::reporter(u64::from(epochs), samples, &["loss"]))
        .fit()
        .into_result()?;
    let wall = started.elapsed().as_secs_f64();
    let loss = result
        .metrics
        .as_ref()
        .and_then(|m| m["loss"].as_f64())
        .unwrap_or(f64::NAN);
    common::summary(
        "linear_regression (Prism)",
        &result,
        wall,
        &[
            (
                "workers",
                format!("{workers}{}", if use_gpu { " sharing 1 GPU" } else { "" }),
            ),
            ("final loss", format!("{loss:.5}")),
        ],
    );
    prism::shutdown();
    if loss.is_nan() || loss > 0.09 {
        return Err(format!("final loss {loss} is above 0.09").into());
    }
    if let Some(path) = common::arg::<PathBuf>("--write-loss")? {
        std::fs::write(&path, format!("{loss}\n"))?;
    }
    if let Some(path) = common::arg::<PathBuf>("--compare-loss")? {
        common::check_against(loss, &path).map_err(|e| e.to_string())?;
    }
    Ok(())
}
