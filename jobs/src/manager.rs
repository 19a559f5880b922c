//! The job manager: the job table in memory and on disk, and one small
//! task per running job that waits for its process (no process per job:
//! supervising a job costs the head a record and a task).

use crate::admission::{Admission, Request};
use crate::error::JobError;
use crate::model::{new_submission_id, DriverInfo, JobDetails, JobStatus, JobType, Submission};
use crate::packages::{PackageName, PackageStore};
use crate::store::{JobFiles, JobRecord};
use crate::supervisor::{self, Launch, STOP_GRACE};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The resources of the node jobs run on, as it offers them in all
/// (resource name to amount); `None` while unknown.
pub type Capacity = Arc<dyn Fn() -> Option<BTreeMap<String, f64>> + Send + Sync>;

/// The cluster's drivers, each with the submission it runs for (if any)
/// and its details as a job of type DRIVER.
pub type Drivers = Arc<dyn Fn() -> Vec<(Option<String>, JobDetails)> + Send + Sync>;

/// How a job manager is set up.
#[derive(Clone)]
pub struct JobSettings {
    /// Where the job table, the jobs' logs and the uploaded packages live.
    pub dir: PathBuf,
    /// The cluster address a job's driver joins (`PRISM_ADDRESS`).
    pub cluster_address: String,
    /// The cluster token a job's driver uses (`PRISM_AUTH_TOKEN`).
    pub token: String,
    /// The address of the node jobs run on.
    pub node_ip: String,
    /// That node's id, when known.
    pub node_id: Option<String>,
    /// Ended jobs kept; the oldest beyond this are removed with their logs.
    pub max_jobs: usize,
    /// The largest package accepted, in bytes.
    pub package_limit_bytes: u64,
    /// The resources of the node jobs run on, to refuse a job that asks
    /// for more than it has.
    pub capacity: Option<Capacity>,
    /// More variables for every job's entrypoint (before its own
    /// `env_vars`), such as `PRISM_TEMP_DIR`.
    pub driver_env: BTreeMap<String, String>,
    /// The cluster's drivers: those started by hand are listed as jobs of
    /// type DRIVER, and a submitted job's driver gives it its job id.
    pub drivers: Option<Drivers>,
}

impl std::fmt::Debug for JobSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSettings")
            .field("dir", &self.dir)
            .field("cluster_address", &self.cluster_address)
            .field("token", &"<hidden>")
            .field("node_ip", &self.node_ip)
            .field("max_jobs", &self.max_jobs)
            .field("package_limit_bytes", &self.package_limit_bytes)
            .finish_non_exhaustive()
    }
}

impl JobSettings {
    /// Settings with the defaults: 1,000 jobs kept, packages up to 100 MiB.
    pub fn new(dir: PathBuf, cluster_address: String, token: String) -> JobSettings {
        JobSettings {
            dir,
            cluster_address,
            token,
            node_ip: "127.0.0.1".into(),
            node_id: None,
            max_jobs: 1000,
            package_limit_bytes: 100 << 20,
            capacity: None,
            driver_env: BTreeMap::new(),
            drivers: None,
        }
    }
}

#[derive(Default)]
struct Table {
    jobs: HashMap<String, JobRecord>,
    next_seq: u64,
    /// What the entrypoints of running jobs hold.
    admission: Admission,
}

/// The head's jobs: submits, watches, stops and forgets them.
pub struct JobManager {
    table: Mutex<Table>,
    /// Woken when an entrypoint gives its resources back, or a waiting
    /// job is stopped.
    freed: tokio::sync::Notify,
    files: JobFiles,
    packages: PackageStore,
    settings: JobSettings,
}

impl std::fmt::Debug for JobManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobManager")
            .field("jobs", &self.table.lock().jobs.len())
            .field("settings", &self.settings)
            .finish()
    }
}

fn now_ms() -> u64 {
    prism_protocol::clock::unix_ms()
}

impl JobManager {
    /// Opens the job table in `settings.dir` (made if absent). Jobs that
    /// were running when the last manager ended are found again if their
    /// process still runs, and marked as ended otherwise. Must run inside
    /// a Tokio runtime.
    pub fn open(settings: JobSettings) -> Result<Arc<JobManager>, JobError> {
        let files = JobFiles::open(settings.dir.join("jobs"))?;
        let packages =
            PackageStore::open(settings.dir.join("packages"), settings.package_limit_bytes)?;
        let records = files.load()?;
        let manager = Arc::new(JobManager {
            table: Mutex::new(Table::default()),
            freed: tokio::sync::Notify::new(),
            files,
            packages,
            settings,
        });
        let mut adopted = Vec::new();
        {
            let mut table = manager.table.lock();
            for mut record in records {
                table.next_seq = table.next_seq.max(record.seq + 1);
                let Some(id) = record.details.submission_id.clone() else {
                    continue;
                };
                if !record.details.status.is_terminal() {
                    match (record.pid, record.pid_start) {
                        (Some(pid), Some(ticks)) if supervisor::still_runs(pid, ticks) => {
                            tracing::info!(job = %id, pid, "found a running job again");
                            table.admission.hold(&id, request_of(&record.details));
                            adopted.push((id.clone(), pid, ticks));
                        }
                        _ => {
                            let code = supervisor::written_status(&manager.files.exit_status(&id));
                            end(&manager.files, &mut record, code, None, true);
                            let _ = manager.files.save(&record).map_err(
                                |e| tracing::warn!(error = %e, "cannot save a job's record"),
                            );
                        }
                    }
                }
                table.jobs.insert(id, record);
            }
        }
        for (id, pid, ticks) in adopted {
            let this = manager.clone();
            tokio::spawn(async move { this.watch_adopted(id, pid, ticks).await });
        }
        Ok(manager)
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &JobSettings {
        &self.settings
    }

    /// Accepts a submission and starts it; answers its submission id.
    pub fn submit(self: &Arc<Self>, submission: Submission) -> Result<String, JobError> {
        let package = match &submission.runtime_env.working_dir {
            Some(uri) => {
                let name = PackageName::from_uri(uri)?;
                if !self.packages.exists(&name) {
                    return Err(JobError::BadRequest(format!(
                        "runtime_env.working_dir {uri:?} was not uploaded to this head \
                         (PUT /api/packages/gcs/{} first; `prism job submit --working-dir` does)",
                        name.as_str()
                    )));
                }
                Some(name)
            }
            None => None,
        };
        if let Some(total) = self.settings.capacity.as_ref().and_then(|c| c()) {
            check_fits(&submission, &total)?;
        }
        let id = submission
            .submission_id
            .clone()
            .unwrap_or_else(new_submission_id);
        let record = {
            let mut table = self.table.lock();
            if table.jobs.contains_key(&id) {
                return Err(JobError::Duplicate(id));
            }
            let seq = table.next_seq;
            table.next_seq += 1;
            let record = JobRecord {
                seq,
                details: JobDetails {
                    job_type: JobType::Submission,
                    job_id: Some(id.clone()),
                    submission_id: Some(id.clone()),
                    driver_info: None,
                    status: JobStatus::Pending,
                    entrypoint: submission.entrypoint.clone(),
                    message: Some("Job has not started yet.".into()),
                    error_type: None,
                    start_time: Some(now_ms()),
                    end_time: None,
                    metadata: submission.metadata.clone(),
                    runtime_env: submission.runtime_env_json.clone(),
                    driver_agent_http_address: None,
                    driver_node_id: self.settings.node_id.clone(),
                    driver_exit_code: None,
                    entrypoint_num_cpus: submission.entrypoint_num_cpus,
                    entrypoint_num_gpus: submission.entrypoint_num_gpus,
                    entrypoint_memory: submission.entrypoint_memory,
                    entrypoint_resources: submission.entrypoint_resources.clone(),
                },
                pid: None,
                pid_start: None,
                stop_requested: false,
            };
            self.files.save(&record)?;
            table.jobs.insert(id.clone(), record.clone());
            self.prune(&mut table);
            record
        };
        tracing::info!(job = %id, entrypoint = %record.details.entrypoint, "job submitted");
        let this = self.clone();
        let env = submission.runtime_env.env_vars.clone();
        let job = id.clone();
        tokio::spawn(async move { this.run(job, package, env).await });
        Ok(id)
    }

    /// Unpacks the working_dir, starts the entrypoint and waits for it.
    async fn run(
        self: Arc<Self>,
        id: String,
        package: Option<PackageName>,
        vars: BTreeMap<String, String>,
    ) {
        if !self.admitted(&id, package.is_some()).await {
            return;
        }
        let folder = self.files.folder(&id);
        let cwd = match package {
            None => Ok(folder.clone()),
            Some(name) => {
                let this = self.clone();
                tokio::task::spawn_blocking(move || this.packages.unpacked(&name))
                    .await
                    .unwrap_or_else(|e| {
                        Err(JobError::BadRequest(format!("unpacking stopped: {e}")))
                    })
            }
        };
        let cwd = match cwd {
            Ok(cwd) => cwd,
            Err(e) => {
                self.update(&id, |r| {
                    set_end(
                        r,
                        JobStatus::Failed,
                        Some("RUNTIME_ENV_SETUP_FAILED"),
                        format!("Job's working_dir could not be set up: {e}"),
                    );
                });
                return;
            }
        };
        let mut env = BTreeMap::new();
        env.insert(
            "PRISM_ADDRESS".to_string(),
            self.settings.cluster_address.clone(),
        );
        env.insert("PRISM_AUTH_TOKEN".to_string(), self.settings.token.clone());
        env.insert("PRISM_JOB_SUBMISSION_ID".to_string(), id.clone());
        env.extend(self.settings.driver_env.clone());
        if !vars.is_empty() {
            // For the workers and actors of a Prism driver the job starts.
            let json = serde_json::to_string(&vars).unwrap_or_default();
            env.insert("PRISM_JOB_ENV_VARS_JSON".to_string(), json);
        }
        env.extend(vars);
        let log = self.files.log(&id);
        let exit_status = self.files.exit_status(&id);
        let started = {
            let mut table = self.table.lock();
            if table.jobs.get(&id).is_some_and(|r| r.stop_requested) {
                drop(table);
                self.update(&id, |r| {
                    set_end(
                        r,
                        JobStatus::Stopped,
                        None,
                        "Job was stopped before it started.".into(),
                    )
                });
                return;
            }
            let spawned = supervisor::spawn(&Launch {
                entrypoint: self.record_entrypoint(&table, &id).as_str(),
                cwd: &cwd,
                env: &env,
                log: &log,
                exit_status: &exit_status,
            });
            match spawned {
                Ok(child) => {
                    let pid = child.id().unwrap_or_default();
                    if let Some(record) = table.jobs.get_mut(&id) {
                        record.pid = Some(pid);
                        record.pid_start = supervisor::start_ticks(pid);
                        record.details.status = JobStatus::Running;
                        record.details.message = Some("Job is currently running.".into());
                        record.details.driver_info = Some(DriverInfo {
                            id: id.clone(),
                            node_ip_address: self.settings.node_ip.clone(),
                            pid: pid.to_string(),
                        });
                        if let Err(e) = self.files.save(record) {
                            tracing::warn!(job = %id, error = %e, "cannot save a job's record");
                        }
                    }
                    Ok(child)
                }
                Err(e) => Err(e),
            }
        };
        let mut child = match started {
            Ok(child) => child,
            Err(e) => {
                self.update(&id, |r| {
                    set_end(
                        r,
                        JobStatus::Failed,
                        Some("ENTRYPOINT_FAILED"),
                        format!("Job's entrypoint could not start: /bin/sh: {e}"),
                    );
                });
                return;
            }
        };
        let pid = child.id();
        tracing::info!(job = %id, pid = ?pid, "job started");
        let code = match child.wait().await {
            Ok(status) => {
                use std::os::unix::process::ExitStatusExt;
                (status.code(), status.signal())
            }
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "cannot wait for a job's process");
                (None, None)
            }
        };
        // A stopped job has ended once the last process of its group has.
        let stopping = self
            .table
            .lock()
            .jobs
            .get(&id)
            .is_some_and(|r| r.stop_requested);
        if let (Some(pid), true) = (pid, stopping) {
            let deadline = tokio::time::Instant::now() + STOP_GRACE + Duration::from_secs(1);
            while supervisor::group_runs(pid) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.update(&id, |r| end(&self.files, r, code.0, code.1, false));
    }

    /// Waits until the job's entrypoint resources are free and holds them;
    /// false when the job was stopped (or forgotten) meanwhile.
    async fn admitted(&self, id: &str, has_package: bool) -> bool {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let total = self.settings.capacity.as_ref().and_then(|c| c());
            {
                let mut table = self.table.lock();
                let Some(record) = table.jobs.get(id) else {
                    return false;
                };
                if record.stop_requested {
                    drop(table);
                    self.update(id, |r| {
                        set_end(
                            r,
                            JobStatus::Stopped,
                            None,
                            "Job was stopped before it started.".into(),
                        )
                    });
                    return false;
                }
                let request = request_of(&record.details);
                let outcome = table.admission.admit(id, request, total.as_ref());
                let admitted = outcome.is_ok();
                let message = match outcome {
                    Ok(()) if has_package => {
                        Some("Job has not started yet: its working_dir is being unpacked.".into())
                    }
                    Ok(()) => None,
                    Err(why) => Some(why),
                };
                if let (Some(message), Some(record)) = (message, table.jobs.get_mut(id)) {
                    if record.details.message.as_deref() != Some(message.as_str()) {
                        record.details.message = Some(message);
                        if let Err(e) = self.files.save(record) {
                            tracing::warn!(job = %id, error = %e, "cannot save a job's record");
                        }
                    }
                }
                if admitted {
                    return true;
                }
            }
            // Woken when resources are given back; the timeout notices a
            // node that grew or registered late.
            let _ = tokio::time::timeout(Duration::from_secs(1), freed).await;
        }
    }

    fn record_entrypoint(&self, table: &Table, id: &str) -> String {
        table
            .jobs
            .get(id)
            .map(|r| r.details.entrypoint.clone())
            .unwrap_or_default()
    }

    /// Waits for a process found running when the manager opened.
    async fn watch_adopted(self: Arc<Self>, id: String, pid: u32, ticks: u64) {
        while supervisor::still_runs(pid, ticks) {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let code = supervisor::written_status(&self.files.exit_status(&id));
        self.update(&id, |r| end(&self.files, r, code, None, false));
    }

    /// Changes a job's record and saves it, under the table's lock (so
    /// no other change is lost); a job that ended gives back what its
    /// entrypoint held.
    fn update(&self, id: &str, change: impl FnOnce(&mut JobRecord)) {
        let mut table = self.table.lock();
        let Some(r) = table.jobs.get_mut(id) else {
            return;
        };
        change(r);
        if let Err(e) = self.files.save(r) {
            tracing::warn!(job = %id, error = %e, "cannot save a job's record");
        }
        if r.details.status.is_terminal() {
            tracing::info!(job = %id, status = %r.details.status, "job ended");
            if table.admission.release(id) {
                self.freed.notify_waiters();
            }
        }
    }

    /// Removes the oldest ended jobs beyond the limit.
    fn prune(&self, table: &mut Table) {
        if table.jobs.len() <= self.settings.max_jobs {
            return;
        }
        let mut ended: Vec<(u64, String)> = table
            .jobs
            .iter()
            .filter(|(_, r)| r.details.status.is_terminal())
            .map(|(id, r)| (r.seq, id.clone()))
            .collect();
        ended.sort();
        let excess = table.jobs.len() - self.settings.max_jobs;
        for (_, id) in ended.into_iter().take(excess) {
            self.forget(table, &id);
        }
    }

    /// Removes an ended job from the table and its folder from the disk,
    /// and its working_dir package once no kept job names it.
    fn forget(&self, table: &mut Table, id: &str) {
        let Some(record) = table.jobs.remove(id) else {
            return;
        };
        if let Err(e) = self.files.remove(id) {
            tracing::warn!(job = %id, error = %e, "cannot remove a job's folder");
        }
        let Some(package) = package_of(&record.details) else {
            return;
        };
        let named = table
            .jobs
            .values()
            .any(|r| package_of(&r.details).as_ref() == Some(&package));
        if !named {
            if let Err(e) = self.packages.remove(&package) {
                tracing::warn!(package = %package.as_str(), error = %e, "cannot remove a package");
            }
        }
    }

    /// The cluster's drivers: the job id of each submission's driver,
    /// and the drivers started by hand.
    fn drivers(&self) -> (HashMap<String, String>, Vec<JobDetails>) {
        let mut linked = HashMap::new();
        let mut by_hand = Vec::new();
        let all = self
            .settings
            .drivers
            .as_ref()
            .map(|d| d())
            .unwrap_or_default();
        for (submission, details) in all {
            match submission {
                Some(s) => {
                    linked.insert(s, details.job_id.unwrap_or_default());
                }
                None => by_hand.push(details),
            }
        }
        (linked, by_hand)
    }

    /// One job's details: a submission by its id, or a driver started by
    /// hand by its job id.
    pub fn get(&self, id: &str) -> Result<JobDetails, JobError> {
        let submitted = self.table.lock().jobs.get(id).map(|r| r.details.clone());
        let (linked, by_hand) = self.drivers();
        match submitted {
            Some(mut details) => {
                if let Some(job_id) = linked.get(id) {
                    details.job_id = Some(job_id.clone());
                }
                Ok(details)
            }
            None => by_hand
                .into_iter()
                .find(|d| d.job_id.as_deref() == Some(id))
                .ok_or_else(|| JobError::NoSuchJob(id.to_string())),
        }
    }

    /// A submission's details, or why there is none: a driver started by
    /// hand is named as such.
    fn submitted(&self, id: &str) -> Result<JobDetails, JobError> {
        if let Some(r) = self.table.lock().jobs.get(id) {
            return Ok(r.details.clone());
        }
        let driver = self.get(id)?;
        let info = driver.driver_info.unwrap_or(DriverInfo {
            id: String::new(),
            node_ip_address: "?".into(),
            pid: "?".into(),
        });
        Err(JobError::BadRequest(format!(
            "job {id} is a driver started by hand (pid {} on {}), not a submission: stop it \
             where it runs, and read its output there",
            info.pid, info.node_ip_address
        )))
    }

    /// Jobs, newest first (submissions and drivers started by hand),
    /// `offset` skipped and at most `limit` given.
    pub fn list(&self, offset: usize, limit: usize) -> Vec<JobDetails> {
        let (linked, by_hand) = self.drivers();
        let mut all: Vec<(u64, u64, JobDetails)> = {
            let table = self.table.lock();
            table
                .jobs
                .values()
                .map(|r| {
                    let mut details = r.details.clone();
                    let driver = details.submission_id.as_ref().and_then(|s| linked.get(s));
                    if let Some(job_id) = driver {
                        details.job_id = Some(job_id.clone());
                    }
                    (details.start_time.unwrap_or(0), r.seq, details)
                })
                .collect()
        };
        all.extend(
            by_hand
                .into_iter()
                .map(|d| (d.start_time.unwrap_or(0), 0, d)),
        );
        all.sort_by_key(|(start, seq, _)| std::cmp::Reverse((*start, *seq)));
        all.into_iter()
            .skip(offset)
            .take(limit)
            .map(|(_, _, d)| d)
            .collect()
    }

    /// Stops a job: SIGTERM to its processes, SIGKILL after the grace.
    /// False when it had ended already.
    pub fn stop(self: &Arc<Self>, id: &str) -> Result<bool, JobError> {
        self.submitted(id)?;
        let pid = {
            let mut table = self.table.lock();
            let record = table
                .jobs
                .get(id)
                .ok_or_else(|| JobError::NoSuchJob(id.to_string()))?;
            if record.details.status.is_terminal() {
                return Ok(false);
            }
            let pid = record.pid;
            if let Some(record) = table.jobs.get_mut(id) {
                record.stop_requested = true;
                if let Err(e) = self.files.save(record) {
                    tracing::warn!(job = %id, error = %e, "cannot save a job's record");
                }
            }
            pid
        };
        tracing::info!(job = %id, "stopping a job");
        // A job waiting for resources sees it at once.
        self.freed.notify_waiters();
        if let Some(pid) = pid {
            supervisor::signal_group(pid, libc::SIGTERM);
            tokio::spawn(async move {
                tokio::time::sleep(STOP_GRACE).await;
                if supervisor::group_runs(pid) && supervisor::signal_group(pid, libc::SIGKILL) {
                    tracing::info!(pid, "a stopped job outlived its grace and was killed");
                }
            });
        }
        Ok(true)
    }

    /// Forgets an ended job and removes its log; a job that has not ended
    /// is refused.
    pub fn delete(&self, id: &str) -> Result<bool, JobError> {
        self.submitted(id)?;
        let mut table = self.table.lock();
        let record = table
            .jobs
            .get(id)
            .ok_or_else(|| JobError::NoSuchJob(id.to_string()))?;
        if !record.details.status.is_terminal() {
            return Err(JobError::Conflict(format!(
                "job {id:?} is {}: stop it first (`prism job stop {id}`), then delete it",
                record.details.status
            )));
        }
        self.forget(&mut table, id);
        Ok(true)
    }

    /// A job's log so far (its last 64 MiB).
    pub fn logs(&self, id: &str) -> Result<String, JobError> {
        self.submitted(id)?;
        let path = self.files.log(id);
        Ok(read_tail(&path, LOG_READ_MAX).unwrap_or_default())
    }

    /// The job's log from byte `offset`: the text (at most `max` bytes,
    /// cut at a line end where one is near) and the offset after it.
    pub fn logs_from(&self, id: &str, offset: u64, max: usize) -> Result<(String, u64), JobError> {
        self.submitted(id)?;
        let path = self.files.log(id);
        let (text, next) = read_from(&path, offset, max).unwrap_or((String::new(), offset));
        Ok((text, next))
    }

    /// The package store's limit, for the upload route.
    pub(crate) fn packages(&self) -> &PackageStore {
        &self.packages
    }

    /// Stops every job that has not ended (the head is stopping): SIGTERM,
    /// then SIGKILL after the grace, waiting at most that long.
    pub async fn stop_all(self: &Arc<Self>) {
        let running: Vec<(String, Option<u32>)> = {
            let mut table = self.table.lock();
            let mut ids = Vec::new();
            for (id, r) in table.jobs.iter_mut() {
                if !r.details.status.is_terminal() {
                    r.stop_requested = true;
                    ids.push((id.clone(), r.pid));
                }
            }
            ids
        };
        self.freed.notify_waiters();
        for (_, pid) in &running {
            if let Some(pid) = pid {
                supervisor::signal_group(*pid, libc::SIGTERM);
            }
        }
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        while tokio::time::Instant::now() < deadline
            && running.iter().any(|(id, _)| {
                self.get(id)
                    .map(|d| !d.status.is_terminal())
                    .unwrap_or(false)
            })
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for (id, pid) in running {
            if let Some(pid) = pid {
                supervisor::signal_group(pid, libc::SIGKILL);
            }
            self.update(&id, |r| {
                if !r.details.status.is_terminal() {
                    set_end(
                        r,
                        JobStatus::Stopped,
                        None,
                        "Job was stopped because the head stopped.".into(),
                    )
                }
            });
        }
    }
}

fn set_end(record: &mut JobRecord, status: JobStatus, error_type: Option<&str>, message: String) {
    record.details.status = status;
    record.details.error_type = error_type.map(str::to_string);
    record.details.message = Some(message);
    record.details.end_time = Some(now_ms());
}

/// Marks a job ended, from its exit status (or the signal that ended
/// it); `restarted` when the head found it gone after starting again.
fn end(
    files: &JobFiles,
    record: &mut JobRecord,
    code: Option<i32>,
    signal: Option<i32>,
    restarted: bool,
) {
    let id = record.details.submission_id.clone().unwrap_or_default();
    let stopped = record.stop_requested || record.details.status == JobStatus::Stopped;
    record.details.driver_exit_code = code;
    match (code, signal) {
        (Some(0), _) => set_end(record, JobStatus::Succeeded, None, "Job finished successfully.".into()),
        _ if stopped => set_end(record, JobStatus::Stopped, None, "Job was intentionally stopped.".into()),
        (Some(code), _) => {
            let tail = log_tail(&files.log(&id), 20, 20_000);
            set_end(
                record,
                JobStatus::Failed,
                Some("ENTRYPOINT_FAILED"),
                format!("Job entrypoint command failed with exit code {code}, last available logs:\n{tail}"),
            )
        }
        (None, Some(signal)) => set_end(
            record,
            JobStatus::Failed,
            Some("ENTRYPOINT_FAILED"),
            format!("Job entrypoint was ended by signal {signal}."),
        ),
        (None, None) if restarted => set_end(
            record,
            JobStatus::Failed,
            Some("HEAD_RESTARTED"),
            "The head restarted while the job ran, and the job's process was gone when it came back.".into(),
        ),
        (None, None) => set_end(
            record,
            JobStatus::Failed,
            Some("ENTRYPOINT_FAILED"),
            "Job's process ended without an exit status.".into(),
        ),
    }
}

/// The working_dir package a job runs in, if any.
fn package_of(d: &JobDetails) -> Option<PackageName> {
    let uri = d.runtime_env.as_ref()?.get("working_dir")?.as_str()?;
    PackageName::from_uri(uri).ok()
}

/// What a job's entrypoint asks for, as resource name and amount (nothing
/// of amount 0).
fn request_of(d: &JobDetails) -> Request {
    request(
        d.entrypoint_num_cpus,
        d.entrypoint_num_gpus,
        d.entrypoint_memory,
        d.entrypoint_resources.as_ref(),
    )
}

fn request(
    cpus: Option<f64>,
    gpus: Option<f64>,
    memory: Option<u64>,
    resources: Option<&BTreeMap<String, f64>>,
) -> Request {
    let mut asked: Request = Vec::new();
    if let Some(c) = cpus {
        asked.push(("CPU".into(), c));
    }
    if let Some(g) = gpus {
        asked.push(("GPU".into(), g));
    }
    if let Some(m) = memory {
        asked.push(("memory".into(), m as f64));
    }
    for (k, v) in resources.into_iter().flatten() {
        asked.push((k.clone(), *v));
    }
    asked.retain(|(_, amount)| *amount > 0.0);
    asked
}

/// Refuses a job whose entrypoint asks for more than the node has in all.
fn check_fits(s: &Submission, total: &BTreeMap<String, f64>) -> Result<(), JobError> {
    let asked = request(
        s.entrypoint_num_cpus,
        s.entrypoint_num_gpus,
        s.entrypoint_memory,
        s.entrypoint_resources.as_ref(),
    );
    for (name, amount) in asked {
        let has = total.get(&name).copied().unwrap_or(0.0);
        if amount > has {
            return Err(JobError::BadRequest(format!(
                "the entrypoint asks for {amount} {name}, but the head node, where jobs run, has \
                 {has} in all; ask for less, or start the head with more (`prism start --head \
                 --num-cpus/--num-gpus/--resources`)"
            )));
        }
    }
    Ok(())
}

/// Up to `max` bytes of the file from `offset`, cut after the last line
/// end when the read was cut short; and the offset after them.
fn read_from(path: &std::path::Path, offset: u64, max: usize) -> Option<(String, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let start = offset.min(len);
    file.seek(SeekFrom::Start(start)).ok()?;
    let mut buf = Vec::new();
    file.take(max as u64).read_to_end(&mut buf).ok()?;
    if buf.len() == max {
        if let Some(end) = buf.iter().rposition(|b| *b == b'\n') {
            buf.truncate(end + 1);
        }
    }
    let next = start + buf.len() as u64;
    Some((String::from_utf8_lossy(&buf).into_owned(), next))
}

/// The last `max` bytes of a file, from a line start where one is near.
fn read_tail(path: &std::path::Path, max: usize) -> Option<String> {
    let len = std::fs::metadata(path).ok()?.len();
    let start = len.saturating_sub(max as u64);
    let (text, _) = read_from(path, start, max)?;
    Some(text)
}

/// The most of a log one answer holds.
const LOG_READ_MAX: usize = 64 << 20;

/// The last `lines` lines of a log, at most `chars` characters.
fn log_tail(path: &std::path::Path, lines: usize, chars: usize) -> String {
    let Some(text) = read_tail(path, 1 << 20) else {
        return String::new();
    };
    let all: Vec<&str> = text.lines().collect();
    let tail = all[all.len().saturating_sub(lines)..].join("\n");
    let skip = tail.chars().count().saturating_sub(chars);
    tail.chars().skip(skip).collect()
}
