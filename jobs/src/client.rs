//! A client of the Jobs API (Ray's `JobSubmissionClient`, in Rust): what
//! `prism job` uses, and what a program submitting work to a cluster can.

use crate::error::JobError;
use crate::model::JobDetails;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::{json, Map, Value};
use sha2::Digest;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// What to submit: the entrypoint and, optionally, the rest of Ray's
/// submission fields.
#[derive(Debug, Clone, Default)]
pub struct JobRequest {
    /// The shell command the job runs.
    pub entrypoint: String,
    /// The id to submit under; the head makes one when `None`.
    pub submission_id: Option<String>,
    /// The runtime environment (`working_dir` as an uploaded package's
    /// URI, `env_vars`).
    pub runtime_env: Option<Map<String, Value>>,
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

/// A client of a head's Jobs API.
///
/// ```no_run
/// # async fn demo() -> Result<(), prism_jobs::JobError> {
/// use prism_jobs::{JobRequest, JobSubmissionClient};
/// let client = JobSubmissionClient::new("http://127.0.0.1:8265", Some("the-token".into()))?;
/// let id = client
///     .submit(&JobRequest { entrypoint: "echo hello".into(), ..Default::default() })
///     .await?;
/// let status = client.wait(&id, std::time::Duration::from_secs(60)).await?;
/// println!("{id}: {status}; {}", client.logs(&id).await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct JobSubmissionClient {
    authority: String,
    token: Option<String>,
}

impl std::fmt::Debug for JobSubmissionClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSubmissionClient")
            .field("address", &self.authority)
            .finish_non_exhaustive()
    }
}

impl JobSubmissionClient {
    /// A client of the head's dashboard at `address` (`http://HOST:PORT`
    /// or `HOST:PORT`), sending `token` as a bearer token.
    pub fn new(address: &str, token: Option<String>) -> Result<JobSubmissionClient, JobError> {
        let rest = if let Some(rest) = address.strip_prefix("http://") {
            rest
        } else if address.starts_with("https://") {
            return Err(JobError::Connect(format!(
                "{address}: the dashboard speaks plain HTTP; reach a remote head through an SSH \
                 tunnel (ssh -L 8265:127.0.0.1:8265 HEAD) and use http://127.0.0.1:8265"
            )));
        } else if address.contains("://") {
            return Err(JobError::Connect(format!(
                "{address}: give the head's dashboard as http://HOST:PORT"
            )));
        } else {
            address
        };
        let authority = rest.trim_end_matches('/').to_string();
        let valid = authority
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !valid {
            return Err(JobError::Connect(format!(
                "{address}: give the head's dashboard as http://HOST:PORT (its port is 8265 \
                 unless the head was started with --dashboard-port)"
            )));
        }
        Ok(JobSubmissionClient { authority, token })
    }

    /// The dashboard's address, `HOST:PORT`.
    pub fn address(&self) -> &str {
        &self.authority
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), JobError> {
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| {
                JobError::Connect(format!(
                    "cannot reach the head's dashboard at http://{}: {e} (is the head running, \
                     with its dashboard on that port? `prism status` on the head tells)",
                    self.authority
                ))
            })?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| JobError::Connect(format!("http://{}: {e}", self.authority)))?;
        let driver = tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.authority);
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| {
                JobError::Connect(format!("cannot make the request {method} {path}: {e}"))
            })?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| JobError::Connect(format!("http://{}{path}: {e}", self.authority)))?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| JobError::Connect(format!("http://{}{path}: {e}", self.authority)))?
            .to_bytes();
        driver.abort();
        Ok((status, bytes))
    }

    async fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Value, JobError> {
        let (status, bytes) = self.call(method, path, body).await?;
        if !(200..300).contains(&status) {
            let message = String::from_utf8_lossy(&bytes).trim().to_string();
            let message = if status == 401 {
                format!(
                    "{message} (give the cluster token in PRISM_AUTH_TOKEN; on the head's \
                     machine it is found by itself)"
                )
            } else {
                message
            };
            return Err(JobError::Server { status, message });
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            JobError::Connect(format!(
                "http://{}{path} answered something that is not the Jobs API: {e}",
                self.authority
            ))
        })
    }

    /// The server's versions (`/api/version`).
    pub async fn version(&self) -> Result<Value, JobError> {
        self.json("GET", "/api/version", None).await
    }

    /// Submits a job; answers its submission id.
    pub async fn submit(&self, request: &JobRequest) -> Result<String, JobError> {
        let body = json!({
            "entrypoint": request.entrypoint,
            "submission_id": request.submission_id,
            "runtime_env": request.runtime_env,
            "metadata": request.metadata,
            "entrypoint_num_cpus": request.entrypoint_num_cpus,
            "entrypoint_num_gpus": request.entrypoint_num_gpus,
            "entrypoint_memory": request.entrypoint_memory,
            "entrypoint_resources": request.entrypoint_resources,
        });
        let answer = self
            .json("POST", "/api/jobs/", Some(body.to_string().into_bytes()))
            .await?;
        answer
            .get("submission_id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                JobError::Connect(format!("the head answered no submission id: {answer}"))
            })
    }

    /// A job's details.
    pub async fn get(&self, id: &str) -> Result<JobDetails, JobError> {
        let value = self
            .json("GET", &format!("/api/jobs/{}", encode(id)), None)
            .await?;
        serde_json::from_value(value)
            .map_err(|e| JobError::Connect(format!("cannot read the job's details: {e}")))
    }

    /// Jobs, newest first.
    pub async fn list(&self) -> Result<Vec<JobDetails>, JobError> {
        let value = self.json("GET", "/api/jobs/", None).await?;
        serde_json::from_value(value)
            .map_err(|e| JobError::Connect(format!("cannot read the job list: {e}")))
    }

    /// Stops a job; false when it had ended already.
    pub async fn stop(&self, id: &str) -> Result<bool, JobError> {
        let value = self
            .json("POST", &format!("/api/jobs/{}/stop", encode(id)), None)
            .await?;
        Ok(value
            .get("stopped")
            .and_then(Value::as_bool)
            .unwrap_or(false))
    }

    /// Deletes an ended job and its log.
    pub async fn delete(&self, id: &str) -> Result<bool, JobError> {
        let value = self
            .json("DELETE", &format!("/api/jobs/{}", encode(id)), None)
            .await?;
        Ok(value
            .get("deleted")
            .and_then(Value::as_bool)
            .unwrap_or(false))
    }

    /// A job's log so far.
    pub async fn logs(&self, id: &str) -> Result<String, JobError> {
        let value = self
            .json("GET", &format!("/api/jobs/{}/logs", encode(id)), None)
            .await?;
        Ok(value
            .get("logs")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string())
    }

    /// Follows a job's log until the job ends, handing each piece to
    /// `out` as it arrives.
    pub async fn tail(&self, id: &str, mut out: impl FnMut(&str)) -> Result<(), JobError> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Message;
        let url = format!("ws://{}/api/jobs/{}/logs/tail", self.authority, encode(id));
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| JobError::Connect(format!("{url}: {e}")))?;
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| JobError::Connect("the token is not a valid header value".into()))?;
            request.headers_mut().insert("authorization", value);
        }
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| {
                JobError::Connect(format!("cannot reach http://{}: {e}", self.authority))
            })?;
        let (mut socket, _) = tokio_tungstenite::client_async(request, stream)
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(response) => JobError::Server {
                    status: response.status().as_u16(),
                    message: String::from_utf8_lossy(
                        response.body().as_deref().unwrap_or_default(),
                    )
                    .into_owned(),
                },
                e => JobError::Connect(format!("{url}: {e}")),
            })?;
        while let Some(message) = socket.next().await {
            match message {
                Ok(Message::Text(text)) => out(text.as_str()),
                Ok(Message::Close(_)) => break,
                Ok(_) => {}
                Err(e) => return Err(JobError::Connect(format!("the log stream broke: {e}"))),
            }
        }
        Ok(())
    }

    /// Waits until the job ends (checking every 100 ms, at most `timeout`);
    /// answers its final status.
    pub async fn wait(
        &self,
        id: &str,
        timeout: std::time::Duration,
    ) -> Result<crate::JobStatus, JobError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let details = self.get(id).await?;
            if details.status.is_terminal() {
                return Ok(details.status);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(JobError::Connect(format!(
                    "job {id} is still {} after {timeout:?}",
                    details.status
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Zips a local folder (leaving out `.git` and `target` folders),
    /// uploads it unless the head has it already, and answers the URI to
    /// give as `runtime_env.working_dir`.
    pub async fn upload_working_dir(&self, dir: &Path) -> Result<String, JobError> {
        let folder = dir.to_path_buf();
        let (name, zipped) = tokio::task::spawn_blocking(move || zip_folder(&folder))
            .await
            .map_err(|e| JobError::Connect(format!("zipping stopped: {e}")))??;
        let path = format!("/api/packages/gcs/{name}");
        let (status, _) = self.call("GET", &path, None).await?;
        if status != 200 {
            let (status, body) = self.call("PUT", &path, Some(zipped)).await?;
            if status != 200 {
                return Err(JobError::Server {
                    status,
                    message: String::from_utf8_lossy(&body).trim().to_string(),
                });
            }
        }
        Ok(format!("gcs://{name}"))
    }
}

/// A path segment with everything but unreserved characters escaped.
fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The folder as a zip (files at its root) and the package name made from
/// its content: the same folder gives the same name.
fn zip_folder(dir: &Path) -> Result<(String, Vec<u8>), JobError> {
    if !dir.is_dir() {
        return Err(JobError::BadRequest(format!(
            "--working-dir {} is not a folder",
            dir.display()
        )));
    }
    let mut files = Vec::new();
    collect(dir, Path::new(""), &mut files)?;
    files.sort();
    let mut hash = sha2::Sha256::new();
    let mut out = std::io::Cursor::new(Vec::new());
    let mut writer = zip::ZipWriter::new(&mut out);
    for relative in &files {
        let path = dir.join(relative);
        let bytes = std::fs::read(&path).map_err(JobError::disk("cannot read", &path))?;
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(&path)
                .map_err(JobError::disk("cannot read", &path))?
                .permissions()
                .mode()
                & 0o777
        };
        let name = relative.to_string_lossy().into_owned();
        hash.update(name.as_bytes());
        hash.update([0]);
        hash.update(mode.to_le_bytes());
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
        let options = zip::write::FileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(mode);
        let zip_error = |e: zip::result::ZipError| JobError::Disk {
            what: "cannot zip",
            path: path.clone(),
            source: std::io::Error::other(e),
        };
        writer.start_file(name, options).map_err(zip_error)?;
        writer
            .write_all(&bytes)
            .map_err(JobError::disk("cannot zip", &path))?;
    }
    writer.finish().map_err(|e| JobError::Disk {
        what: "cannot zip",
        path: dir.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    drop(writer);
    let digest: String = hash
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((format!("_ray_pkg_{digest}.zip"), out.into_inner()))
}

fn collect(
    root: &Path,
    relative: &Path,
    out: &mut Vec<std::path::PathBuf>,
) -> Result<(), JobError> {
    let here = root.join(relative);
    let entries =
        std::fs::read_dir(&here).map_err(JobError::disk("cannot read the folder", &here))?;
    for entry in entries {
        let entry = entry.map_err(JobError::disk("cannot read the folder", &here))?;
        let name = entry.file_name();
        let path = relative.join(&name);
        let link = entry
            .file_type()
            .map_err(JobError::disk("cannot read", entry.path()))?
            .is_symlink();
        let kind =
            std::fs::metadata(entry.path()).map_err(JobError::disk("cannot read", entry.path()))?;
        if kind.is_dir() {
            // A linked folder is left out: it may lead back up.
            if link {
                continue;
            }
            if name == ".git" || name == "target" {
                continue;
            }
            collect(root, &path, out)?;
        } else if kind.is_file() {
            out.push(path);
        }
    }
    Ok(())
}
