//! Hyperparameter search on Prism: Ray Tune for Rust.
//!
//! A [`SearchSpace`] says what each hyperparameter may be (fixed values,
//! grids, distributions, nested configs); a [`Tuner`] runs the training
//! function once per config, each run a `prism_train::Trainer` of its own
//! (so `prism_train::report` and checkpoints work inside it), as many at
//! once as the cluster's CPUs hold; the [`ResultGrid`] compares the trials
//! by a metric. Each trial keeps its folder (`params.json`, `result.json`,
//! `progress.csv`, checkpoints) under the experiment's folder, next to a
//! `results.csv` table of every trial.
//!
//! A scheduler ([`Asha`], [`MedianStopping`]) or a stop condition
//! ([`TuneConfig::stop_at`]) can end trials early, and [`Tuner::restore`]
//! continues an experiment whose driver died.
#![warn(missing_docs, missing_debug_implementations)]
#![doc(test(attr(deny(warnings))))]

mod error;
mod rng;
mod schedulers;
mod space;
mod state;
mod trial;
mod tuner;

pub use error::TuneError;
pub use schedulers::{Asha, Decision, Fifo, MedianStopping, TrialScheduler};
pub use space::{choice, grid, loguniform, quniform, randint, randn, uniform, Param, SearchSpace};
pub use trial::{Mode, TrialResult};
pub use tuner::{ResultGrid, SharedScheduler, TuneConfig, Tuner};
