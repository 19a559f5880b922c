//! The run's folder on the driver: `result.json`, `progress.csv`, and the
//! checkpoints with their retention.

use super::checkpoint::{sync_path, sync_tree, Checkpoint};
use super::config::{CheckpointConfig, CheckpointScoreOrder};
use super::context::staging_dir;
use super::error::{io_err, TrainError};
use serde_json::{Map, Value};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One kept checkpoint and the metrics reported with it.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub(crate) iteration: u64,
    pub(crate) checkpoint: Checkpoint,
    pub(crate) metrics: Map<String, Value>,
}

/// Writes the run's files as reports arrive.
#[derive(Debug)]
pub(crate) struct RunStorage {
    dir: PathBuf,
    config: CheckpointConfig,
    results: File,
    progress: File,
    /// progress.csv's columns, fixed by the first row.
    columns: Option<Vec<String>>,
    /// Committed checkpoints, oldest first.
    pub(crate) kept: Vec<Kept>,
}

impl RunStorage {
    /// Opens the run's folder: a new run starts it; a folder that already
    /// holds a run (its driver died, or it ended) is resumed, as Ray Train
    /// does for a Trainer made again with the same storage path and name.
    /// Returns the rows already in `result.json`, in order.
    pub(crate) fn open(
        dir: &Path,
        config: CheckpointConfig,
        params: &Value,
    ) -> Result<(Self, Vec<Map<String, Value>>), TrainError> {
        std::fs::create_dir_all(dir).map_err(|e| io_err("create the run folder", dir, e))?;
        let results_path = dir.join("result.json");
        let rows = read_rows(&results_path)?;
        let params_path = dir.join("params.json");
        if !params_path.exists() {
            std::fs::write(&params_path, format!("{params:#}\n"))
                .map_err(|e| io_err("write", &params_path, e))?;
        }
        let open = |name: &str| {
            let path = dir.join(name);
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| io_err("open", &path, e))
        };
        let progress_path = dir.join("progress.csv");
        let columns = std::fs::read_to_string(&progress_path)
            .ok()
            .and_then(|text| text.lines().next().map(parse_csv_header))
            .filter(|c| !c.is_empty());
        // Committed checkpoints are those a row names; one committed after
        // its row was lost would be replayed, so it does not count.
        let mut kept = Vec::new();
        for row in &rows {
            let (Some(name), Some(iteration)) = (
                row.get("checkpoint_dir_name").and_then(Value::as_str),
                row.get("training_iteration").and_then(Value::as_u64),
            ) else {
                continue;
            };
            let path = dir.join(name);
            if path.is_dir() {
                kept.push(Kept {
                    iteration,
                    checkpoint: Checkpoint::from_directory(path),
                    metrics: row.clone(),
                });
            }
        }
        let storage = RunStorage {
            dir: dir.to_path_buf(),
            config,
            results: open("result.json")?,
            progress: open("progress.csv")?,
            columns,
            kept,
        };
        Ok((storage, rows))
    }

    /// Removes staging folders and checkpoints that no report committed
    /// (left by workers that died), before a new worker group starts.
    pub(crate) fn clean_uncommitted(&self) -> Result<(), TrainError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| io_err("read", &self.dir, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let committed = self.kept.iter().any(|k| k.checkpoint.path() == path);
            let stray = name.starts_with(".staging_checkpoint_")
                || (name.starts_with("checkpoint_") && !committed);
            if stray && path.is_dir() {
                std::fs::remove_dir_all(&path).map_err(|e| io_err("remove", &path, e))?;
            }
        }
        Ok(())
    }

    /// Commits the checkpoint staged for `iteration`: renamed into place
    /// whole, after its files reached the disk.
    pub(crate) fn commit_checkpoint(
        &mut self,
        iteration: u64,
        metrics: &Map<String, Value>,
    ) -> Result<Checkpoint, TrainError> {
        let staged = staging_dir(&self.dir, iteration);
        let final_dir = self.dir.join(format!("checkpoint_{iteration:06}"));
        if !staged.is_dir() {
            // A worker said it staged one: without the folder, resuming
            // from it would silently start over.
            return Err(TrainError::Io {
                action: "find the staged checkpoint",
                path: staged,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "a worker reported a checkpoint that is not in the run folder; \
                     storage_path must be a folder every worker can write",
                ),
            });
        }
        sync_tree(&staged)?;
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(|e| io_err("replace", &final_dir, e))?;
        }
        std::fs::rename(&staged, &final_dir).map_err(|e| io_err("commit", &final_dir, e))?;
        sync_path(&self.dir)?;
        let checkpoint = Checkpoint::from_directory(final_dir);
        self.kept.push(Kept {
            iteration,
            checkpoint: checkpoint.clone(),
            metrics: metrics.clone(),
        });
        self.enforce_retention()?;
        Ok(checkpoint)
    }

    /// The score of a kept checkpoint (higher is better after the order).
    fn score(&self, kept: &Kept) -> f64 {
        let Some(attr) = &self.config.checkpoint_score_attribute else {
            return kept.iteration as f64;
        };
        let raw = kept.metrics.get(attr).and_then(Value::as_f64);
        match (raw, self.config.checkpoint_score_order) {
            (Some(v), CheckpointScoreOrder::Max) => v,
            (Some(v), CheckpointScoreOrder::Min) => -v,
            (None, _) => f64::NEG_INFINITY,
        }
    }

    /// Deletes checkpoints beyond `num_to_keep`, worst first; the latest
    /// always stays (a restart resumes from it).
    fn enforce_retention(&mut self) -> Result<(), TrainError> {
        let Some(keep) = self.config.num_to_keep else {
            return Ok(());
        };
        let keep = keep.max(1);
        let latest = self.kept.last().map(|k| k.iteration);
        let mut ranked: Vec<(f64, u64)> = self
            .kept
            .iter()
            .map(|k| (self.score(k), k.iteration))
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        let best: Vec<u64> = ranked.iter().take(keep).map(|(_, i)| *i).collect();
        let (stay, go): (Vec<Kept>, Vec<Kept>) = std::mem::take(&mut self.kept)
            .into_iter()
            .partition(|k| best.contains(&k.iteration) || Some(k.iteration) == latest);
        self.kept = stay;
        for k in go {
            let path = k.checkpoint.path();
            std::fs::remove_dir_all(path)
                .map_err(|e| io_err("remove an old checkpoint", path, e))?;
        }
        Ok(())
    }

    /// The best kept checkpoint by the configured score (the latest when
    /// none is configured).
    pub(crate) fn best(&self) -> Option<&Kept> {
        self.kept.iter().max_by(|a, b| {
            self.score(a)
                .total_cmp(&self.score(b))
                .then(a.iteration.cmp(&b.iteration))
        })
    }

    /// Appends one report to result.json (a JSON line) and progress.csv.
    pub(crate) fn append(&mut self, row: &Map<String, Value>) -> Result<(), TrainError> {
        let line = format!("{}\n", Value::Object(row.clone()));
        self.results
            .write_all(line.as_bytes())
            .and_then(|_| self.results.flush())
            .map_err(|e| io_err("append to", &self.dir.join("result.json"), e))?;
        let mut text = String::new();
        let columns = self.columns.get_or_insert_with(|| {
            let names: Vec<String> = row.keys().cloned().collect();
            text.push_str(&csv_line(
                names.iter().map(|n| csv_field(&Value::String(n.clone()))),
            ));
            names
        });
        text.push_str(&csv_line(
            columns
                .iter()
                .map(|c| row.get(c).map(csv_field).unwrap_or_default()),
        ));
        self.progress
            .write_all(text.as_bytes())
            .and_then(|_| self.progress.flush())
            .map_err(|e| io_err("append to", &self.dir.join("progress.csv"), e))
    }
}

/// The rows of a `result.json`. A last line without its newline (the
/// driver died while writing it) is cut off, so the file stays JSON lines.
fn read_rows(path: &Path) -> Result<Vec<Map<String, Value>>, TrainError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("read", path, e)),
    };
    let complete = text.rfind('\n').map(|i| i + 1).unwrap_or(0);
    if complete < text.len() {
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| io_err("open", path, e))?;
        file.set_len(complete as u64)
            .map_err(|e| io_err("cut a torn last line from", path, e))?;
    }
    let mut rows = Vec::new();
    for (n, line) in text[..complete].lines().enumerate() {
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(row)) => rows.push(row),
            _ => {
                return Err(TrainError::Io {
                    action: "read",
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "line {} is not a JSON object; fix or move the run folder",
                            n + 1
                        ),
                    ),
                })
            }
        }
    }
    Ok(rows)
}

/// The column names of a progress.csv header written by [`csv_line`].
fn parse_csv_header(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut field = String::new();
    let (mut quoted, mut chars) = (false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => names.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    names.push(field);
    names
}

fn csv_line(fields: impl Iterator<Item = String>) -> String {
    let mut line = fields.collect::<Vec<_>>().join(",");
    line.push('\n');
    line
}

fn csv_field(value: &Value) -> String {
    let text = match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("prism-storage-{name}-{}", std::process::id()))
    }

    fn metrics(loss: f64) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("loss".into(), loss.into());
        m
    }

    #[test]
    fn retention_keeps_the_best_by_score_and_always_the_latest() {
        let dir = temp("retention");
        let _ = std::fs::remove_dir_all(&dir);
        let config = CheckpointConfig::new()
            .num_to_keep(1)
            .checkpoint_score_attribute("loss", CheckpointScoreOrder::Min);
        let (mut storage, _) = RunStorage::open(&dir, config, &Value::Null).unwrap();
        for (i, loss) in [(1u64, 0.5), (2, 0.1), (3, 0.3)] {
            std::fs::create_dir_all(staging_dir(&dir, i)).unwrap();
            std::fs::write(staging_dir(&dir, i).join("w"), [i as u8]).unwrap();
            storage.commit_checkpoint(i, &metrics(loss)).unwrap();
        }
        let kept: Vec<u64> = storage.kept.iter().map(|k| k.iteration).collect();
        assert_eq!(kept, vec![2, 3], "best (loss 0.1) and latest");
        assert_eq!(storage.best().unwrap().iteration, 2);
        assert!(!dir.join("checkpoint_000001").exists());
        assert_eq!(std::fs::read(dir.join("checkpoint_000002/w")).unwrap(), [2]);
        std::fs::create_dir_all(dir.join("checkpoint_000004")).unwrap();
        std::fs::create_dir_all(staging_dir(&dir, 5)).unwrap();
        storage.clean_uncommitted().unwrap();
        assert!(!dir.join("checkpoint_000004").exists() && !staging_dir(&dir, 5).exists());
        assert!(dir.join("checkpoint_000003").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn progress_csv_quotes_fields_and_keeps_its_first_columns() {
        let dir = temp("csv");
        let _ = std::fs::remove_dir_all(&dir);
        let (mut storage, _) =
            RunStorage::open(&dir, CheckpointConfig::new(), &Value::Null).unwrap();
        let mut row = metrics(0.25);
        row.insert("note".into(), "a, \"b\"".into());
        storage.append(&row).unwrap();
        storage.append(&metrics(0.125)).unwrap();
        let csv = std::fs::read_to_string(dir.join("progress.csv")).unwrap();
        assert_eq!(csv, "loss,note\n0.25,\"a, \"\"b\"\"\"\n0.125,\n");
        let json = std::fs::read_to_string(dir.join("result.json")).unwrap();
        assert_eq!(json.lines().count(), 2);
        // A torn last line (the driver died while writing) is cut off on
        // reopening; the columns of progress.csv are kept.
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("result.json"))
            .unwrap()
            .write_all(b"{\"loss\": 0.0")
            .unwrap();
        let (mut again, rows) =
            RunStorage::open(&dir, CheckpointConfig::new(), &Value::Null).unwrap();
        assert_eq!(rows.len(), 2);
        again.append(&metrics(0.5)).unwrap();
        let csv = std::fs::read_to_string(dir.join("progress.csv")).unwrap();
        assert!(csv.ends_with("0.125,\n0.5,\n"), "{csv}");
        assert_eq!(
            std::fs::read_to_string(dir.join("result.json"))
                .unwrap()
                .lines()
                .count(),
            3
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
