//! A hyperparameter search on Fashion-MNIST with ASHA: the learning rate
//! (log-uniform), the hidden layer's size (a choice) and the batch size (a
//! grid) of a one-hidden-layer classifier, 8 trials by default, each a
//! one-worker Trainer on one CPU, reporting the validation accuracy every
//! epoch. ASHA stops the trials that fall behind at each rung. Prints every
//! trial, the best config, its accuracy and the time the search took.
//!
//! ```text
//! bash scripts/setup-torch.sh && . ~/.cache/prism/torch-2.11.0/prism-torch.env
//! bash scripts/fetch-dataset.sh fashion-mnist
//! cargo run --release -p prism-tune --features tch --example tune_fashion_mnist
//! ```
//!
//! Options: `--samples N` (samples of the space, each over 2 batch sizes;
//! default 4, so 8 trials), `--epochs N` (ASHA's `max_t`; default 4),
//! `--data FILE`.

#[path = "../../train/examples/common/mod.rs"]
#[allow(dead_code)]
mod common;
#[path = "../../train/examples/common/fmnist.rs"]
mod fmnist;

use common::BoxError;
use fmnist::{load, OnDevice, PIXELS};
use prism_train::data::DistributedSampler;
use prism_train::torch::{Adam, AdamConfig};
use prism_tune::{choice, grid, loguniform, Asha, Mode, SearchSpace, TuneConfig, Tuner};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

#[derive(Serialize, Deserialize)]
struct Params {
    data: PathBuf,
    lr: f64,
    hidden: i64,
    batch_size: usize,
    epochs: u32,
    seed: u64,
}

fn trial(p: Params) -> Result<(), BoxError> {
    // Each trial is a fresh process: keep glibc from returning freed
    // buffers to the system and faulting them in again on the next step
    // (its adaptive mmap threshold would learn this only after a while),
    // which cut the first epoch from about 1.5 s to 1.05 s here.
    // SAFETY: mallopt only changes allocator settings.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
    tch::set_num_threads(1);
    tch::manual_seed(p.seed as i64);
    let images = load(&p.data)?;
    let data = OnDevice::new(&images, Device::Cpu);
    let mut vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let net = nn::seq()
        .add(nn::linear(
            &root / "fc1",
            PIXELS as i64,
            p.hidden,
            Default::default(),
        ))
        .add_fn(|x| x.relu())
        .add(nn::linear(&root / "fc2", p.hidden, 10, Default::default()));
    let mut opt = Adam::new(&vs, p.lr, AdamConfig::default());
    let start = common::resume(&mut vs, &mut opt)?;
    let mut sampler = DistributedSampler::new(images.train.len(), 0, 1)?.seed(p.seed);
    let staging = std::env::temp_dir().join(format!("tune-fmnist-{}", std::process::id()));
    for epoch in start..p.epochs {
        sampler.set_epoch(u64::from(epoch));
        let mut loss_sum = Tensor::zeros([], (Kind::Float, Device::Cpu));
        let mut steps = 0.0f64;
        for batch in sampler.batches(p.batch_size)? {
            let indices: Vec<usize> = batch.iter().map(|&i| images.train[i]).collect();
            let (x, y) = data.batch(&indices);
            let loss = net.forward(&x).cross_entropy_for_logits(&y);
            opt.backward_step(&loss);
            loss_sum += loss.detach();
            steps += 1.0;
        }
        let mut correct = 0i64;
        tch::no_grad(|| {
            for chunk in images.test.chunks(1000) {
                let (x, y) = data.batch(chunk);
                let predicted = net.forward(&x).argmax(-1, false);
                correct += predicted.eq_tensor(&y).sum(Kind::Int64).int64_value(&[]);
            }
        });
        let checkpoint = common::checkpoint(&vs, &opt, epoch, &staging)?;
        prism_train::report(
            serde_json::json!({
                "epoch": epoch,
                "loss": loss_sum.double_value(&[]) / steps.max(1.0),
                "val_accuracy": correct as f64 / images.test.len() as f64,
            }),
            checkpoint,
        )?;
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let samples: usize = common::arg("--samples")?.unwrap_or(4);
    let epochs: u32 = common::arg("--epochs")?.unwrap_or(4);
    let data = match common::arg::<PathBuf>("--data")? {
        Some(path) => path,
        None => std::env::var_os("PRISM_DATA_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                    .join(".cache/prism/datasets")
            })
            .join("fashion-mnist.bin"),
    };
    // Fail here, not in every trial, if the data is missing.
    drop(load(&data)?);
    prism::init(prism::Config::default())?;
    let started = Instant::now();
    let space = SearchSpace::new()
        .set("lr", loguniform(1e-4, 1e-2))
        .set("hidden", choice([64, 128, 256]))
        .set("batch_size", grid([64, 128]))
        .set("epochs", epochs)
        .set("seed", 7)
        .set("data", data.display().to_string());
    let results = Tuner::new(trial, space)
        .tune_config(
            TuneConfig::new()
                .metric("val_accuracy")
                .mode(Mode::Max)
                .num_samples(samples)
                .scheduler(
                    Asha::new()
                        .max_t(u64::from(epochs))
                        .grace_period(1)
                        .reduction_factor(2.0),
                )
                .seed(7),
        )
        .run_config(
            prism_train::RunConfig::new(format!("tune_fashion_mnist_{}", std::process::id()))
                .storage_path(std::env::temp_dir().join("prism_results")),
        )
        .fit()?;
    let wall = started.elapsed().as_secs_f64();
    println!("\n| trial | lr | hidden | batch | epochs run | val_accuracy |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for t in results.trials() {
        println!(
            "| {} | {:.2e} | {} | {} | {} | {} |",
            t.name,
            t.config["lr"].as_f64().unwrap_or(f64::NAN),
            t.config["hidden"],
            t.config["batch_size"],
            t.metrics_history.len(),
            match (&t.error, t.last("val_accuracy")) {
                (Some(e), _) => format!("error: {e}"),
                (None, Some(a)) => format!("{:.4}", a),
                (None, None) => "-".into(),
            }
        );
    }
    let best = results.get_best_result()?;
    let accuracy = best.last("val_accuracy").unwrap_or(f64::NAN);
    println!(
        "\nbest: {} with {} -> val_accuracy {:.4}; {} trials in {wall:.1} s",
        best.name,
        best.config,
        accuracy,
        results.len()
    );
    println!(
        "prism-tune fashion_mnist trials={} wall_s={wall:.2} best_accuracy={accuracy:.4}",
        results.len()
    );
    prism::shutdown();
    Ok(())
}
