//! Jobs: the head's job manager, made in the control store's process, and
//! `prism job`, the command that submits and follows jobs through the
//! head's dashboard (Ray's `ray job`).

use crate::args::{ControlStoreArgs, JobArgs, JobCommand, JobTarget, SubmitArgs};
use crate::common::runtime;
use prism_gcs::pb::NodeState;
use prism_gcs::{GcsServer, Token};
use prism_jobs::{
    JobConfig, JobDetails, JobManager, JobRequest, JobSettings, JobStatus, JobSubmissionClient,
};
use prism_protocol::messages::{DriverRecord, DRIVER_RECORD_PREFIX};
use prism_raylet::NodeRecord;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

/// The job manager of a head's control store: its table in the head's
/// state folder, its jobs' drivers pointed at this head.
pub(crate) fn manager(
    args: &ControlStoreArgs,
    gcs: &GcsServer,
    token: &Token,
) -> Result<Arc<JobManager>, String> {
    let mut tunables = JobConfig::default();
    tunables.apply_env_overrides().map_err(|e| e.to_string())?;
    let address = format!("{}:{}", args.node_ip, gcs.address().port());
    let mut settings = JobSettings::new(args.jobs_dir.clone(), address, token.reveal().to_string());
    settings.node_ip = args.node_ip.clone();
    settings.max_jobs = tunables.max_kept;
    settings.package_limit_bytes = tunables.package_limit_bytes;
    settings.driver_env.insert(
        "PRISM_TEMP_DIR".into(),
        args.temp.temp_dir.to_string_lossy().into_owned(),
    );
    let view = gcs.view();
    settings.capacity = Some(Arc::new(move || {
        let nodes = view.nodes();
        let head = nodes
            .iter()
            .find(|n| n.is_head && n.state == NodeState::Alive as i32)?;
        Some(
            head.total
                .iter()
                .map(|r| (r.name.clone(), r.units as f64 / 10_000.0))
                .collect(),
        )
    }));
    let view = gcs.view();
    let keep = tunables.max_kept;
    settings.drivers = Some(Arc::new(move || {
        let alive: std::collections::HashSet<String> = view
            .nodes()
            .into_iter()
            .filter(|n| n.state == NodeState::Alive as i32)
            .map(|n| n.node_id)
            .collect();
        let records: Vec<(String, DriverRecord)> = view
            .kv_entries(DRIVER_RECORD_PREFIX)
            .into_iter()
            .filter_map(|(key, value)| Some((key, serde_json::from_slice(&value).ok()?)))
            .collect();
        let gone = ended_beyond(&records, &alive, keep);
        if !gone.is_empty() {
            match view.kv_delete_keys(&gone) {
                Ok(n) => tracing::info!(
                    removed = n,
                    kept = keep,
                    "removed the records of the oldest ended drivers"
                ),
                Err(e) => tracing::warn!(error = %e, "could not remove old driver records"),
            }
        }
        records
            .into_iter()
            .filter(|(key, _)| !gone.contains(key))
            .map(|(_, r)| {
                let details = JobDetails::from_driver(&r, alive.contains(&r.node_id));
                (r.submission_id, details)
            })
            .collect()
    }));
    JobManager::open(settings).map_err(|e| e.to_string())
}

/// The keys of the oldest ended drivers' records beyond the newest `keep`
/// ended ones (as the job table keeps its newest ended jobs): a driver
/// ended when its record says so or its node is no longer alive.
fn ended_beyond(
    records: &[(String, DriverRecord)],
    alive: &std::collections::HashSet<String>,
    keep: usize,
) -> Vec<String> {
    let mut ended: Vec<(u64, &String)> = records
        .iter()
        .filter(|(_, r)| r.end_time.is_some() || !alive.contains(&r.node_id))
        .map(|(key, r)| (r.end_time.unwrap_or(r.start_time), key))
        .collect();
    if ended.len() <= keep {
        return Vec::new();
    }
    ended.sort();
    let excess = ended.len() - keep;
    ended
        .into_iter()
        .take(excess)
        .map(|(_, key)| key.clone())
        .collect()
}

/// `prism job ...`.
pub(crate) fn run(args: JobArgs) -> Result<ExitCode, String> {
    let temp = args.target.temp.temp_dir.clone();
    let client = client(&args.target, &temp)?;
    let rt = runtime()?;
    rt.block_on(async move {
        match args.command {
            JobCommand::Submit(submit) => submit_job(&client, submit).await,
            JobCommand::Status { id } => {
                let d = client.get(&id).await.map_err(|e| e.to_string())?;
                say!("Status for job '{id}': {}", d.status);
                if let Some(m) = d.message {
                    say!("Status message: {m}");
                }
                Ok(ExitCode::SUCCESS)
            }
            JobCommand::Logs { id, follow } => {
                if follow {
                    client
                        .tail(&id, |text| print!("{text}"))
                        .await
                        .map_err(|e| e.to_string())?;
                } else {
                    print!("{}", client.logs(&id).await.map_err(|e| e.to_string())?);
                }
                Ok(ExitCode::SUCCESS)
            }
            JobCommand::Stop { id, no_wait } => {
                let stopped = client.stop(&id).await.map_err(|e| e.to_string())?;
                if !stopped {
                    say!("Job '{id}' had already ended.");
                    return Ok(ExitCode::SUCCESS);
                }
                say!("Stopping job '{id}'.");
                if !no_wait {
                    let status = client
                        .wait(&id, std::time::Duration::from_secs(30))
                        .await
                        .map_err(|e| e.to_string())?;
                    say!("Job '{id}' is {status}.");
                }
                Ok(ExitCode::SUCCESS)
            }
            JobCommand::List => {
                let jobs = client.list().await.map_err(|e| e.to_string())?;
                say!(
                    "{}",
                    serde_json::to_string_pretty(&jobs).map_err(|e| e.to_string())?
                );
                Ok(ExitCode::SUCCESS)
            }
            JobCommand::Delete { id } => {
                client.delete(&id).await.map_err(|e| e.to_string())?;
                say!("Job '{id}' deleted.");
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

/// The client for the head named by `--address`, `PRISM_ADDRESS` (when it
/// is a dashboard's `http://` address), or this machine's head.
fn client(target: &JobTarget, temp: &std::path::Path) -> Result<JobSubmissionClient, String> {
    let (address, token) = dashboard_and_token(target, temp)?;
    JobSubmissionClient::new(&address, token).map_err(|e| e.to_string())
}

/// The head's dashboard named by `--address`, `PRISM_ADDRESS` (when it is
/// an `http://` address), or this machine's head; and the token from
/// `PRISM_AUTH_TOKEN` or the one saved on this machine.
pub(crate) fn dashboard_and_token(
    target: &JobTarget,
    temp: &std::path::Path,
) -> Result<(String, Option<String>), String> {
    let from_env = std::env::var("PRISM_ADDRESS")
        .ok()
        .filter(|a| a.starts_with("http://") || a.starts_with("https://"));
    let address = match target.address.clone().or(from_env) {
        Some(a) => a,
        None => NodeRecord::list(temp)
            .into_iter()
            .filter(|r| r.is_head)
            .find_map(|r| r.dashboard)
            .map(|at| format!("http://{at}"))
            .ok_or_else(|| {
                format!(
                    "no head with a dashboard runs on this machine (none recorded in {}): give \
                     the head's dashboard with --address http://HOST:8265 or PRISM_ADDRESS",
                    NodeRecord::dir(temp).display()
                )
            })?,
    };
    // The token: from the environment, or the one saved on this machine.
    let token = match std::env::var("PRISM_AUTH_TOKEN") {
        Ok(t) if !t.is_empty() => Some(t),
        _ => Token::find(None, temp).ok().map(|t| t.reveal().to_string()),
    };
    Ok((address, token))
}

async fn submit_job(client: &JobSubmissionClient, args: SubmitArgs) -> Result<ExitCode, String> {
    if args.entrypoint.is_empty() {
        return Err(
            "give the command to run after --, as in `prism job submit -- ./my_driver`".into(),
        );
    }
    let mut runtime_env = match &args.runtime_env_json {
        Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(_) | Err(_) => {
                return Err(format!("--runtime-env-json {text:?} is not a JSON object"));
            }
        },
        None => serde_json::Map::new(),
    };
    if let Some(dir) = &args.working_dir {
        let uri = client
            .upload_working_dir(dir)
            .await
            .map_err(|e| format!("--working-dir {}: {e}", dir.display()))?;
        runtime_env.insert("working_dir".into(), serde_json::Value::String(uri));
    }
    let metadata = match &args.metadata_json {
        Some(text) => Some(
            serde_json::from_str::<BTreeMap<String, String>>(text)
                .map_err(|e| format!("--metadata-json {text:?}: {e} (an object of strings)"))?,
        ),
        None => None,
    };
    let entrypoint_resources =
        match &args.entrypoint_resources {
            Some(text) => Some(serde_json::from_str::<BTreeMap<String, f64>>(text).map_err(
                |e| format!("--entrypoint-resources {text:?}: {e} (an object of numbers)"),
            )?),
            None => None,
        };
    let request = JobRequest {
        entrypoint: shell_join(&args.entrypoint),
        submission_id: args.submission_id.clone(),
        runtime_env: (!runtime_env.is_empty()).then_some(runtime_env),
        metadata,
        entrypoint_num_cpus: args.entrypoint_num_cpus,
        entrypoint_num_gpus: args.entrypoint_num_gpus,
        entrypoint_memory: args.entrypoint_memory,
        entrypoint_resources,
    };
    let id = client.submit(&request).await.map_err(|e| e.to_string())?;
    eprintln!("Job '{id}' submitted successfully.");
    if args.no_wait {
        say!("{id}");
        eprintln!(
            "Follow it with `prism job logs --follow {id}`; see it with `prism job status {id}`."
        );
        return Ok(ExitCode::SUCCESS);
    }
    client
        .tail(&id, |text| {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        })
        .await
        .map_err(|e| e.to_string())?;
    let status = client
        .wait(&id, std::time::Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    let details = client.get(&id).await.map_err(|e| e.to_string())?;
    match status {
        JobStatus::Succeeded => {
            eprintln!("Job '{id}' succeeded.");
            Ok(ExitCode::SUCCESS)
        }
        other => {
            eprintln!(
                "Job '{id}' {other}: {}",
                details.message.unwrap_or_default()
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The words after `--` as one shell command: a single word is taken as
/// written (it may be a whole command line), several are quoted where
/// they need it.
fn shell_join(words: &[String]) -> String {
    if let [one] = words {
        return one.clone();
    }
    words
        .iter()
        .map(|w| {
            let plain = !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b));
            if plain {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::{ended_beyond, shell_join};
    use prism_protocol::messages::DriverRecord;

    fn record(job: &str, node: &str, start: u64, end: Option<u64>) -> (String, DriverRecord) {
        (
            format!("prism/driver/{job}"),
            DriverRecord {
                job_id: job.into(),
                submission_id: None,
                pid: 1,
                node_id: node.into(),
                node_ip: "10.0.0.1".into(),
                entrypoint: String::new(),
                start_time: start,
                end_time: end,
            },
        )
    }

    #[test]
    fn the_oldest_ended_drivers_beyond_the_limit_go_and_running_ones_stay() {
        let alive: std::collections::HashSet<String> = ["a".to_string()].into();
        let records = vec![
            record("1", "a", 10, Some(50)),
            record("2", "a", 20, None),
            record("3", "b", 30, None),
            record("4", "a", 40, Some(45)),
            record("5", "a", 60, Some(70)),
        ];
        // Job 2 runs; job 3's node died. Ended, oldest first: 3 (started
        // at 30), 4 (ended at 45), 1 (50), 5 (70).
        assert_eq!(
            ended_beyond(&records, &alive, 2),
            vec!["prism/driver/3".to_string(), "prism/driver/4".to_string()]
        );
        assert!(ended_beyond(&records, &alive, 4).is_empty());
        assert_eq!(ended_beyond(&records, &alive, 0).len(), 4);
    }

    #[test]
    fn words_after_the_dashes_become_one_command() {
        assert_eq!(shell_join(&["echo hi && ls".into()]), "echo hi && ls");
        assert_eq!(
            shell_join(&["echo".into(), "it's".into(), "a b".into()]),
            r"echo 'it'\''s' 'a b'"
        );
    }
}
