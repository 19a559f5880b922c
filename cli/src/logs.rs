//! Logs: each node's agent lists and reads the files of its session's
//! `logs/` folder (workers' `worker-<n>.out|.err|.log`, drivers'
//! `driver-<pid>.log`), the head passes the reads on, and `prism logs`
//! (Ray's `ray logs`) shows them from any machine: one file by name, a
//! worker's or an actor's output, or a job's log, its last lines or
//! followed as it grows.

use crate::args::LogsArgs;
use crate::common::runtime;
use prism_protocol::ids::WorkerId;
use prism_state::{encode, Kind, StateClient};
use serde_json::{json, Value};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// The most one read answers.
const READ_MAX: u64 = 4 << 20;
/// The most lines `tail` gives.
const TAIL_MAX: usize = 100_000;

/// The files of `dir`, each with its size and when it last changed.
pub(crate) fn list(dir: &Path) -> Value {
    let mut files: Vec<Value> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            Some(json!({
                "name": e.file_name().to_string_lossy(),
                "size": meta.len(),
                "modified_ms": modified,
            }))
        })
        .collect();
    files.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    json!({ "files": files })
}

/// What a read asks for, from its query string.
#[derive(Debug, Default)]
pub(crate) struct LogRead {
    /// The file, by name.
    pub(crate) name: Option<String>,
    /// Or a worker's output: its id and stream (`out`, `err` or `log`).
    pub(crate) worker_id: Option<String>,
    pub(crate) stream: Option<String>,
    /// The last lines.
    pub(crate) tail: Option<usize>,
    /// Or the bytes from this offset on.
    pub(crate) offset: Option<u64>,
}

impl LogRead {
    pub(crate) fn from_pairs(
        pairs: &std::collections::HashMap<String, String>,
    ) -> Result<LogRead, String> {
        let number = |k: &str| -> Result<Option<u64>, String> {
            pairs
                .get(k)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| format!("{k} {v:?} is not a whole number"))
                })
                .transpose()
        };
        let tail = number("tail")?.map(|t| t as usize);
        if tail.is_some_and(|t| t == 0 || t > TAIL_MAX) {
            return Err(format!("tail must be 1 to {TAIL_MAX} lines"));
        }
        Ok(LogRead {
            name: pairs.get("name").cloned(),
            worker_id: pairs.get("worker_id").cloned(),
            stream: pairs.get("stream").cloned(),
            tail,
            offset: number("offset")?,
        })
    }

    /// The file in `dir` this read names; refused when the name is not a
    /// plain file name of that folder.
    fn path(&self, dir: &Path) -> Result<PathBuf, String> {
        let name = match (&self.name, &self.worker_id) {
            (Some(name), None) => name.clone(),
            (None, Some(worker)) => {
                let id = WorkerId::parse(worker)
                    .ok_or_else(|| format!("{worker:?} is not a worker id (worker-<hex>)"))?;
                let stream = self.stream.as_deref().unwrap_or("out");
                if !["out", "err", "log"].contains(&stream) {
                    return Err(format!("stream {stream:?} is not out, err or log"));
                }
                format!("worker-{}.{stream}", id.0 as u64)
            }
            _ => return Err("name a file (name=) or a worker (worker_id=)".into()),
        };
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            && !name.starts_with('.');
        if !plain {
            return Err(format!("{name:?} is not a log file's name"));
        }
        let path = dir.join(&name);
        if !path.is_file() {
            return Err(format!(
                "no log file {name:?} on this node (`prism logs` lists them)"
            ));
        }
        Ok(path)
    }

    /// Reads what was asked: `{name, text, offset (after the text), size}`.
    pub(crate) fn run(&self, dir: &Path) -> Result<Value, String> {
        let path = self.path(dir)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut file =
            std::fs::File::open(&path).map_err(|e| format!("cannot open {name}: {e}"))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let start = match (self.offset, self.tail) {
            (Some(offset), _) => offset.min(size),
            (None, _) => size.saturating_sub(READ_MAX),
        };
        file.seek(SeekFrom::Start(start))
            .map_err(|e| format!("cannot read {name}: {e}"))?;
        let mut bytes = Vec::new();
        file.take(READ_MAX)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read {name}: {e}"))?;
        let next = start + bytes.len() as u64;
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if let (None, Some(lines)) = (self.offset, self.tail) {
            let all: Vec<&str> = text.lines().collect();
            let mut kept = all[all.len().saturating_sub(lines)..].join("\n");
            if text.ends_with('\n') && !kept.is_empty() {
                kept.push('\n');
            }
            text = kept;
        }
        Ok(json!({ "name": name, "text": text, "offset": next, "size": size }))
    }
}

/// `prism logs`.
pub(crate) fn run(args: LogsArgs) -> Result<ExitCode, String> {
    let (address, token) =
        crate::jobs::dashboard_and_token(&args.target, &args.target.temp.temp_dir)?;
    let rt = runtime()?;
    if let Some(job) = &args.job {
        // A submission's log, through the Jobs API.
        let client =
            prism_jobs::JobSubmissionClient::new(&address, token).map_err(|e| e.to_string())?;
        return rt.block_on(async move {
            if args.follow {
                client
                    .tail(job, |text| print!("{text}"))
                    .await
                    .map_err(|e| e.to_string())?;
            } else {
                let text = client.logs(job).await.map_err(|e| e.to_string())?;
                print!("{}", last_lines(&text, args.tail));
            }
            Ok(ExitCode::SUCCESS)
        });
    }
    let state = StateClient::new(&address, token).map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let stream = if args.err { "err" } else { "out" };
        // What to read, and on which node.
        let (node, what) = if let Some(actor) = &args.actor {
            let row = state.get(Kind::Actors, actor).await.map_err(|e| e.to_string())?;
            let worker = row["worker_id"].as_str().map(str::to_string).ok_or_else(|| {
                format!("actor {actor} has no worker now (it is {}): its output is in the log of the worker it had", row["state"])
            })?;
            (node_of(&row), format!("worker_id={}&stream={stream}", encode(&worker)))
        } else if let Some(worker) = &args.worker {
            let row = state.get(Kind::Workers, worker).await.map_err(|e| e.to_string())?;
            (node_of(&row), format!("worker_id={}&stream={stream}", encode(worker)))
        } else if let Some(file) = &args.file {
            (args.node.clone(), format!("name={}", encode(file)))
        } else {
            // No file named: list every node's files.
            let listing = state.logs(args.node.as_deref()).await.map_err(|e| e.to_string())?;
            for node in listing["nodes"].as_array().into_iter().flatten() {
                println!("{} ({})", node["node_id"].as_str().unwrap_or("?"), node["node_ip"].as_str().unwrap_or("?"));
                for f in node["files"].as_array().into_iter().flatten() {
                    println!("  {:<40} {:>12} bytes", f["name"].as_str().unwrap_or(""), f["size"]);
                }
            }
            return Ok(ExitCode::SUCCESS);
        };
        let node = match node {
            Some(n) => n,
            None => head_node(&state).await?,
        };
        let first = state
            .log_file(&node, &format!("{what}&tail={}", args.tail))
            .await
            .map_err(|e| e.to_string())?;
        print!("{}", first["text"].as_str().unwrap_or(""));
        if args.follow {
            let mut offset = first["offset"].as_u64().unwrap_or(0);
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let more = state
                    .log_file(&node, &format!("{what}&offset={offset}"))
                    .await
                    .map_err(|e| e.to_string())?;
                print!("{}", more["text"].as_str().unwrap_or(""));
                use std::io::Write;
                let _ = std::io::stdout().flush();
                offset = more["offset"].as_u64().unwrap_or(offset);
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn node_of(row: &Value) -> Option<String> {
    row["node_id"].as_str().map(str::to_string)
}

/// The head node's id: where a file named without `--node` is read.
async fn head_node(state: &StateClient) -> Result<String, String> {
    let mut query = prism_state::Query::new(Kind::Nodes);
    query.limit = prism_state::MAX_LIMIT;
    let nodes = state.list(&query).await.map_err(|e| e.to_string())?;
    nodes
        .rows
        .iter()
        .find(|n| n["is_head_node"] == true)
        .and_then(|n| n["node_id"].as_str())
        .map(str::to_string)
        .ok_or_else(|| "the cluster has no live head node: name the node with --node".into())
}

fn last_lines(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let mut out = all[all.len().saturating_sub(lines)..].join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_name_plain_files_of_the_folder_only_and_tail_or_follow() {
        let dir = std::env::temp_dir().join(format!("prism-logs-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("worker-7.out"), "a\nb\nc\n").unwrap();
        let pairs = |v: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let read = LogRead::from_pairs(&pairs(&[("name", "worker-7.out"), ("tail", "2")])).unwrap();
        let answer = read.run(&dir).unwrap();
        assert_eq!(answer["text"], "b\nc\n");
        assert_eq!(answer["offset"], 6);
        let read =
            LogRead::from_pairs(&pairs(&[("name", "worker-7.out"), ("offset", "4")])).unwrap();
        assert_eq!(read.run(&dir).unwrap()["text"], "c\n");
        let worker = format!("worker-{:032x}", 7u128);
        let read = LogRead::from_pairs(&pairs(&[("worker_id", &worker)])).unwrap();
        assert_eq!(read.run(&dir).unwrap()["name"], "worker-7.out");
        for bad in [
            vec![("name", "../etc/passwd")],
            vec![("name", ".hidden")],
            vec![("name", "absent.log")],
            vec![("worker_id", "w-1")],
            vec![("worker_id", &worker), ("stream", "core")],
            vec![],
        ] {
            let read = LogRead::from_pairs(&pairs(&bad)).unwrap();
            assert!(read.run(&dir).is_err(), "{bad:?}");
        }
        for bad in [
            vec![("tail", "0")],
            vec![("tail", "x")],
            vec![("offset", "-1")],
        ] {
            assert!(LogRead::from_pairs(&pairs(&bad)).is_err(), "{bad:?}");
        }
        assert_eq!(list(&dir)["files"][0]["name"], "worker-7.out");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
