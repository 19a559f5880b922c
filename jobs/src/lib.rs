//! Prism's jobs: work handed to a running cluster from outside it, as Ray's
//! Jobs API does it.
//!
//! The head's dashboard serves [`router`] (Ray's REST routes: submit,
//! list, details, stop, delete, logs and a log tail, and `working_dir`
//! packages) over a [`JobManager`], which runs each job's entrypoint as a
//! shell command on the head, with `PRISM_ADDRESS` and the token set so
//! that a Prism program it starts joins the cluster as the job's driver.
//! Its table and logs live on the head's disk, one folder per job, and
//! outlive the head's process: a head that starts again lists the jobs it
//! had and finds their processes again. [`JobSubmissionClient`] is the
//! client `prism job` uses; Ray's own `ray job` CLI and SDK work too.
//!
//! ```no_run
//! # async fn demo() -> Result<(), prism_jobs::JobError> {
//! use prism_jobs::{JobManager, JobSettings, Submission};
//! let settings = JobSettings::new("/tmp/jobs".into(), "127.0.0.1:6380".into(), "token".into());
//! let manager = JobManager::open(settings)?;
//! let id = manager.submit(Submission::parse(br#"{"entrypoint": "echo hi"}"#)?)?;
//! println!("{:?}", manager.get(&id)?.status);
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations)]

mod admission;
mod client;
mod config;
mod error;
mod http;
mod manager;
mod model;
mod packages;
mod store;
mod supervisor;

pub use client::{JobRequest, JobSubmissionClient};
pub use config::JobConfig;
pub use error::JobError;
pub use http::{router, API_VERSION, RAY_VERSION};
pub use manager::{Capacity, Drivers, JobManager, JobSettings};
pub use model::{
    check_id, new_submission_id, DriverInfo, JobDetails, JobStatus, JobType, RuntimeEnv,
    Submission, SUPPORTED_RUNTIME_ENV_KEYS,
};
pub use packages::PackageName;
