//! The Jobs API's vocabulary, in the JSON shapes Ray's job server gives
//! and Ray's clients read: a job's status and details, a submission and
//! its runtime environment, and the checks a submission must pass.

use crate::error::JobError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A job's state. `Stopped`, `Succeeded` and `Failed` are terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    /// Accepted; its entrypoint has not started (its message says why).
    Pending,
    /// Its entrypoint runs.
    Running,
    /// Stopped by a user.
    Stopped,
    /// Its entrypoint exited with status 0.
    Succeeded,
    /// Its entrypoint exited with another status, or could not start.
    Failed,
}

impl JobStatus {
    /// Whether the job has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Stopped | JobStatus::Succeeded | JobStatus::Failed
        )
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobStatus::Pending => "PENDING",
            JobStatus::Running => "RUNNING",
            JobStatus::Stopped => "STOPPED",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
        })
    }
}

/// Whether a job was submitted through the API or is a driver that joined
/// the cluster by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobType {
    /// Submitted through the Jobs API.
    Submission,
    /// A driver started by hand.
    Driver,
}

/// The process that runs a job's entrypoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    /// The process's id, as text (Ray's field is the driver's job id).
    pub id: String,
    /// The address of the node it runs on.
    pub node_ip_address: String,
    /// Its process id, as text.
    pub pid: String,
}

/// One job, as `GET /api/jobs/{id}` answers it (Ray's `JobDetails`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDetails {
    /// Submission or driver.
    #[serde(rename = "type")]
    pub job_type: JobType,
    /// The cluster's id for the job's driver; Prism gives the submission
    /// id (a submitted job's driver is known by it).
    pub job_id: Option<String>,
    /// The id the job was submitted under.
    pub submission_id: Option<String>,
    /// The entrypoint's process, once it started.
    pub driver_info: Option<DriverInfo>,
    /// Its state.
    pub status: JobStatus,
    /// The shell command it runs.
    pub entrypoint: String,
    /// What happened, or what it waits for.
    pub message: Option<String>,
    /// Why it failed, in one word (`ENTRYPOINT_FAILED`, `HEAD_RESTARTED`, ...).
    pub error_type: Option<String>,
    /// When it was submitted, in Unix milliseconds.
    pub start_time: Option<u64>,
    /// When it ended, in Unix milliseconds.
    pub end_time: Option<u64>,
    /// The submitter's labels.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Its runtime environment, as submitted.
    pub runtime_env: Option<Map<String, Value>>,
    /// Not served by Prism (Ray's per-node agent address); always null.
    pub driver_agent_http_address: Option<String>,
    /// The node its entrypoint runs on.
    pub driver_node_id: Option<String>,
    /// The entrypoint's exit status, once it exited.
    pub driver_exit_code: Option<i32>,
    /// CPUs asked for the entrypoint.
    pub entrypoint_num_cpus: Option<f64>,
    /// GPUs asked for the entrypoint.
    pub entrypoint_num_gpus: Option<f64>,
    /// Memory asked for the entrypoint, in bytes.
    pub entrypoint_memory: Option<u64>,
    /// Custom resources asked for the entrypoint.
    pub entrypoint_resources: Option<BTreeMap<String, f64>>,
}

impl JobDetails {
    /// A driver started by hand, as the job list shows it (`node_alive`:
    /// whether the node it ran on is still a member).
    pub fn from_driver(
        record: &prism_protocol::messages::DriverRecord,
        node_alive: bool,
    ) -> JobDetails {
        let (status, message) = match (record.end_time, node_alive) {
            (Some(_), _) => (JobStatus::Succeeded, "The driver disconnected."),
            (None, true) => (JobStatus::Running, "The driver is connected."),
            (None, false) => (JobStatus::Failed, "The driver's node died."),
        };
        JobDetails {
            job_type: JobType::Driver,
            job_id: Some(record.job_id.clone()),
            submission_id: None,
            driver_info: Some(DriverInfo {
                id: record.job_id.clone(),
                node_ip_address: record.node_ip.clone(),
                pid: record.pid.to_string(),
            }),
            status,
            entrypoint: record.entrypoint.clone(),
            message: Some(message.into()),
            error_type: None,
            start_time: Some(record.start_time),
            end_time: record.end_time,
            metadata: None,
            runtime_env: None,
            driver_agent_http_address: None,
            driver_node_id: Some(record.node_id.clone()),
            driver_exit_code: None,
            entrypoint_num_cpus: None,
            entrypoint_num_gpus: None,
            entrypoint_memory: None,
            entrypoint_resources: None,
        }
    }
}

/// The runtime environment keys Prism applies.
pub const SUPPORTED_RUNTIME_ENV_KEYS: &[&str] = &["working_dir", "env_vars", "excludes", "config"];

/// A job's runtime environment, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeEnv {
    /// The package (`gcs://_ray_pkg_<hash>.zip`) to unpack and run in.
    pub working_dir: Option<String>,
    /// Environment variables for the job's processes.
    pub env_vars: BTreeMap<String, String>,
}

impl RuntimeEnv {
    /// Checks a runtime environment as submitted: only the supported
    /// keys, `env_vars` a map of strings, `working_dir` an uploaded
    /// package.
    pub fn parse(value: &Map<String, Value>) -> Result<RuntimeEnv, JobError> {
        let mut env = RuntimeEnv::default();
        for (key, v) in value {
            match key.as_str() {
                "working_dir" => match v {
                    Value::Null => {}
                    Value::String(uri) => {
                        crate::packages::PackageName::from_uri(uri)?;
                        env.working_dir = Some(uri.clone());
                    }
                    other => {
                        return Err(JobError::BadRequest(format!(
                            "runtime_env.working_dir must be the URI of an uploaded package \
                             (gcs://_ray_pkg_<hash>.zip), not {other}"
                        )))
                    }
                },
                "env_vars" => match v {
                    Value::Null => {}
                    Value::Object(vars) => {
                        for (name, value) in vars {
                            let Value::String(value) = value else {
                                return Err(JobError::BadRequest(format!(
                                    "runtime_env.env_vars[{name:?}] must be a string, not {value}"
                                )));
                            };
                            if name.is_empty() || name.contains('=') || name.contains('\0') {
                                return Err(JobError::BadRequest(format!(
                                    "runtime_env.env_vars has a bad variable name {name:?}"
                                )));
                            }
                            if value.contains('\0') {
                                return Err(JobError::BadRequest(format!(
                                    "runtime_env.env_vars[{name:?}] holds a NUL byte"
                                )));
                            }
                            env.env_vars.insert(name.clone(), value.clone());
                        }
                    }
                    other => {
                        return Err(JobError::BadRequest(format!(
                            "runtime_env.env_vars must be an object of strings, not {other}"
                        )))
                    }
                },
                // Ray's per-env options (setup timeout, eager install):
                // accepted, nothing to set up here takes long. `excludes`
                // is the client's, applied when it zipped the working_dir.
                "config" | "excludes" => {}
                // Fields a client adds for itself (`_ray_commit`).
                other if other.starts_with('_') => {}
                other => {
                    return Err(JobError::BadRequest(format!(
                        "runtime_env key {other:?} is not supported by Prism; the supported \
                         keys are {}",
                        SUPPORTED_RUNTIME_ENV_KEYS.join(", ")
                    )))
                }
            }
        }
        Ok(env)
    }
}

/// A submission, checked (the body of `POST /api/jobs/`).
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// The shell command to run.
    pub entrypoint: String,
    /// The id asked for, if any.
    pub submission_id: Option<String>,
    /// The runtime environment, as sent (kept for the job's details).
    pub runtime_env_json: Option<Map<String, Value>>,
    /// The runtime environment, checked.
    pub runtime_env: RuntimeEnv,
    /// Labels.
    pub metadata: Option<BTreeMap<String, String>>,
    /// CPUs for the entrypoint.
    pub entrypoint_num_cpus: Option<f64>,
    /// GPUs for the entrypoint.
    pub entrypoint_num_gpus: Option<f64>,
    /// Memory for the entrypoint, in bytes.
    pub entrypoint_memory: Option<u64>,
    /// Custom resources for the entrypoint.
    pub entrypoint_resources: Option<BTreeMap<String, f64>>,
}

/// The fields of a submission Ray's clients send.
const SUBMIT_FIELDS: &[&str] = &[
    "entrypoint",
    "submission_id",
    "job_id",
    "runtime_env",
    "metadata",
    "entrypoint_num_cpus",
    "entrypoint_num_gpus",
    "entrypoint_memory",
    "entrypoint_resources",
    "entrypoint_label_selector",
];

/// The longest entrypoint accepted, in bytes.
const MAX_ENTRYPOINT: usize = 64 * 1024;

impl Submission {
    /// Parses and checks the body of a submission.
    ///
    /// ```
    /// let s = prism_jobs::Submission::parse(br#"{"entrypoint": "echo hi"}"#).unwrap();
    /// assert_eq!(s.entrypoint, "echo hi");
    /// assert!(prism_jobs::Submission::parse(br#"{"entrypoint": 3}"#).is_err());
    /// ```
    pub fn parse(body: &[u8]) -> Result<Submission, JobError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| JobError::BadRequest(format!("the body is not valid JSON: {e}")))?;
        let Value::Object(fields) = value else {
            return Err(JobError::BadRequest(
                "the body must be a JSON object with at least \"entrypoint\"".into(),
            ));
        };
        if let Some(unknown) = fields.keys().find(|k| !SUBMIT_FIELDS.contains(&k.as_str())) {
            return Err(JobError::BadRequest(format!(
                "unknown field {unknown:?}; a submission has {}",
                SUBMIT_FIELDS.join(", ")
            )));
        }
        let entrypoint = match fields.get("entrypoint") {
            Some(Value::String(e)) if !e.trim().is_empty() => e.clone(),
            Some(Value::String(_)) => {
                return Err(JobError::BadRequest("\"entrypoint\" is empty".into()))
            }
            None | Some(Value::Null) => {
                return Err(JobError::BadRequest(
                    "\"entrypoint\" is required: the shell command the job runs".into(),
                ))
            }
            Some(other) => {
                return Err(JobError::BadRequest(format!(
                    "\"entrypoint\" must be a string, not {other}"
                )))
            }
        };
        if entrypoint.len() > MAX_ENTRYPOINT || entrypoint.contains('\0') {
            return Err(JobError::BadRequest(format!(
                "\"entrypoint\" must be at most {MAX_ENTRYPOINT} bytes with no NUL byte"
            )));
        }
        let submission_id = match (
            optional_string(&fields, "submission_id")?,
            optional_string(&fields, "job_id")?,
        ) {
            (Some(id), _) | (None, Some(id)) => {
                check_id(&id)?;
                Some(id)
            }
            (None, None) => None,
        };
        let runtime_env_json = match fields.get("runtime_env") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m.clone()),
            Some(other) => {
                return Err(JobError::BadRequest(format!(
                    "\"runtime_env\" must be an object, not {other}"
                )))
            }
        };
        let runtime_env = match &runtime_env_json {
            Some(m) => RuntimeEnv::parse(m)?,
            None => RuntimeEnv::default(),
        };
        let metadata = match fields.get("metadata") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => {
                let mut out = BTreeMap::new();
                for (k, v) in m {
                    let Value::String(v) = v else {
                        return Err(JobError::BadRequest(format!(
                            "metadata values must be strings; metadata[{k:?}] is {v}"
                        )));
                    };
                    out.insert(k.clone(), v.clone());
                }
                Some(out)
            }
            Some(other) => {
                return Err(JobError::BadRequest(format!(
                    "\"metadata\" must be an object of strings, not {other}"
                )))
            }
        };
        let entrypoint_resources = match fields.get("entrypoint_resources") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => {
                let mut out = BTreeMap::new();
                for (k, v) in m {
                    let amount = v.as_f64().filter(|a| a.is_finite() && *a >= 0.0);
                    let Some(amount) = amount else {
                        return Err(JobError::BadRequest(format!(
                            "entrypoint_resources[{k:?}] must be a number at least 0, not {v}"
                        )));
                    };
                    out.insert(k.clone(), amount);
                }
                Some(out)
            }
            Some(other) => {
                return Err(JobError::BadRequest(format!(
                    "\"entrypoint_resources\" must be an object of numbers, not {other}"
                )))
            }
        };
        let entrypoint_memory = match fields.get("entrypoint_memory") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                JobError::BadRequest(format!(
                    "\"entrypoint_memory\" must be a whole number of bytes, not {v}"
                ))
            })?),
        };
        Ok(Submission {
            entrypoint,
            submission_id,
            runtime_env_json,
            runtime_env,
            metadata,
            entrypoint_num_cpus: amount(&fields, "entrypoint_num_cpus")?,
            entrypoint_num_gpus: amount(&fields, "entrypoint_num_gpus")?,
            entrypoint_memory,
            entrypoint_resources,
        })
    }
}

fn optional_string(fields: &Map<String, Value>, key: &str) -> Result<Option<String>, JobError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(JobError::BadRequest(format!(
            "{key:?} must be a string, not {other}"
        ))),
    }
}

fn amount(fields: &Map<String, Value>, key: &str) -> Result<Option<f64>, JobError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(a) if a.is_finite() && a >= 0.0 => Ok(Some(a)),
            _ => Err(JobError::BadRequest(format!(
                "{key:?} must be a number at least 0, not {v}"
            ))),
        },
    }
}

/// A submission id is a name in the job table and a folder name on the
/// head's disk: letters, digits, `-`, `_` and `.`, 1 to 128 of them, not
/// starting with `.`.
pub fn check_id(id: &str) -> Result<(), JobError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(JobError::BadRequest(format!(
            "submission id {id:?} must be 1 to 128 letters, digits, '-', '_' or '.', not \
             starting with '.'"
        )))
    }
}

/// A new submission id, as Ray makes them: `raysubmit_` and 16 letters
/// and digits.
pub fn new_submission_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let random = uuid::Uuid::new_v4();
    let more = uuid::Uuid::new_v4();
    let bytes = random.as_bytes().iter().chain(more.as_bytes()).take(16);
    let tail: String = bytes
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    format!("raysubmit_{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submission_refuses_what_ray_would_not_run() {
        let bad: &[(&[u8], &str)] = &[
            (b"{", "not valid JSON"),
            (b"[1]", "JSON object"),
            (br#"{}"#, "required"),
            (br#"{"entrypoint": ""}"#, "empty"),
            (br#"{"entrypoint": "x", "bogus": 1}"#, "unknown field"),
            (
                br#"{"entrypoint": "x", "metadata": {"a": 1}}"#,
                "must be strings",
            ),
            (
                br#"{"entrypoint": "x", "runtime_env": {"pip": ["numpy"]}}"#,
                "working_dir, env_vars",
            ),
            (
                br#"{"entrypoint": "x", "runtime_env": {"env_vars": {"A": 1}}}"#,
                "must be a string",
            ),
            (
                br#"{"entrypoint": "x", "submission_id": "../x"}"#,
                "submission id",
            ),
            (
                br#"{"entrypoint": "x", "entrypoint_num_cpus": -1}"#,
                "at least 0",
            ),
            (
                br#"{"entrypoint": "x", "runtime_env": {"working_dir": "/home/me"}}"#,
                "gcs://",
            ),
        ];
        for (body, expected) in bad {
            let err = Submission::parse(body).expect_err(&String::from_utf8_lossy(body));
            assert!(
                err.to_string().contains(expected),
                "{err} lacks {expected:?}"
            );
        }
    }

    #[test]
    fn a_submission_as_rays_client_sends_it_is_read() {
        let body = br#"{"entrypoint": "echo hi", "submission_id": null, "job_id": null,
            "runtime_env": {"env_vars": {"A": "1"}, "working_dir": "gcs://_ray_pkg_0123abcd.zip"},
            "metadata": {"owner": "me"}, "entrypoint_num_cpus": 1, "entrypoint_num_gpus": null,
            "entrypoint_memory": null, "entrypoint_resources": null}"#;
        let s = Submission::parse(body).unwrap();
        assert_eq!(s.runtime_env.env_vars["A"], "1");
        assert_eq!(
            s.runtime_env.working_dir.as_deref(),
            Some("gcs://_ray_pkg_0123abcd.zip")
        );
        assert_eq!(s.entrypoint_num_cpus, Some(1.0));
        assert_eq!(s.submission_id, None);
    }

    #[test]
    fn new_ids_look_like_rays_and_pass_the_check() {
        let id = new_submission_id();
        assert!(id.starts_with("raysubmit_") && id.len() == 26, "{id}");
        check_id(&id).unwrap();
        assert_ne!(id, new_submission_id());
    }
}
