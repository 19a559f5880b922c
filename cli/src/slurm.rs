//! Prism inside a Slurm allocation: `srun prism start --slurm --block &`
//! in an `sbatch` script starts the head on the allocation's first node
//! and joins the others to it, each offering the CPUs and GPUs Slurm gave
//! it; `eval "$(prism wait --slurm)"` then waits until every node has
//! joined and sets `PRISM_ADDRESS` (and `PRISM_TEMP_DIR`) for the driver.
//!
//! The nodes meet through a folder only the user can read in the job's
//! submit folder (`.prism-slurm-<job id>/`, shared by the nodes as Slurm
//! clusters share home folders): the head writes its address and the
//! cluster token there; the others wait for them. Each node keeps its
//! session in a folder of the job's own (`/tmp/prism-slurm-<job id>`), so
//! that two jobs on one machine never meet. The nodes run as the job's
//! step: they stop when the allocation ends.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a node waits for the head's address and token.
pub(crate) const MEET_LIMIT: Duration = Duration::from_secs(300);

/// What Slurm tells a task of a job step about its allocation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Allocation {
    pub(crate) job_id: String,
    /// This node's index in the allocation (`SLURM_NODEID`); 0 runs the
    /// head.
    pub(crate) node_index: usize,
    /// The allocation's nodes, in Slurm's order.
    pub(crate) nodes: Vec<String>,
    pub(crate) cpus: Option<u32>,
    pub(crate) gpus: Option<u32>,
    /// The folder `sbatch` ran in.
    pub(crate) submit_dir: PathBuf,
}

impl Allocation {
    /// Reads the allocation from Slurm's variables (`var` looks one up).
    pub(crate) fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Allocation, String> {
        let need = |name: &str| {
            var(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                format!(
                    "{name} is not set: --slurm reads the allocation from Slurm's variables; \
                     run it under srun inside an sbatch or salloc allocation"
                )
            })
        };
        let job_id = need("SLURM_JOB_ID")?;
        if !job_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(format!("SLURM_JOB_ID {job_id:?} is not a job id"));
        }
        let node_index = need("SLURM_NODEID")?
            .parse::<usize>()
            .map_err(|e| format!("SLURM_NODEID: {e}"))?;
        let list = var("SLURM_JOB_NODELIST")
            .or_else(|| var("SLURM_NODELIST"))
            .ok_or("SLURM_JOB_NODELIST is not set: run under srun inside an allocation")?;
        let nodes = expand_nodelist(&list)?;
        if node_index >= nodes.len() {
            return Err(format!(
                "SLURM_NODEID {node_index} is past the {} node(s) of SLURM_JOB_NODELIST {list}",
                nodes.len()
            ));
        }
        let number = |name: &str| -> Result<Option<u32>, String> {
            match var(name).filter(|v| !v.is_empty()) {
                None => Ok(None),
                // "2(x3)" is how Slurm writes per-node counts for several.
                Some(v) => v
                    .split('(')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .parse::<u32>()
                    .map(Some)
                    .map_err(|e| format!("{name}={v}: {e}")),
            }
        };
        let cpus = number("SLURM_CPUS_ON_NODE")?;
        let gpus = match number("SLURM_GPUS_ON_NODE")? {
            Some(n) => Some(n),
            None => var("CUDA_VISIBLE_DEVICES")
                .filter(|v| !v.trim().is_empty() && v.trim() != "-1")
                .map(|v| v.split(',').count() as u32),
        };
        let submit_dir = PathBuf::from(need("SLURM_SUBMIT_DIR")?);
        Ok(Allocation {
            job_id,
            node_index,
            nodes,
            cpus,
            gpus,
            submit_dir,
        })
    }

    /// The folder the job's nodes meet in.
    pub(crate) fn meeting_dir(&self) -> PathBuf {
        self.submit_dir
            .join(format!(".prism-slurm-{}", self.job_id))
    }

    /// The job's own session folder on each node.
    pub(crate) fn temp_dir(&self) -> PathBuf {
        std::env::temp_dir().join(format!("prism-slurm-{}", self.job_id))
    }
}

/// Expands a Slurm host list (`gpu[01-03,07],login1`) into host names.
pub(crate) fn expand_nodelist(list: &str) -> Result<Vec<String>, String> {
    let bad = |why: &str| format!("the Slurm node list {list:?} cannot be read: {why}");
    let mut hosts = Vec::new();
    let mut rest = list.trim();
    while !rest.is_empty() {
        // One entry: up to a comma outside brackets.
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '[' => depth += 1,
                    ']' => depth -= 1,
                    _ => {}
                }
                c == ',' && depth == 0
            })
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        let entry = &rest[..end];
        rest = rest.get(end + 1..).unwrap_or("");
        match entry.find('[') {
            None if entry.is_empty() => return Err(bad("an empty name")),
            None => hosts.push(entry.to_string()),
            Some(open) => {
                let close = entry.rfind(']').ok_or_else(|| bad("a '[' without ']'"))?;
                let (prefix, suffix) = (&entry[..open], &entry[close + 1..]);
                for range in entry[open + 1..close].split(',') {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    let width = a.len();
                    let from: u64 = a.parse().map_err(|_| bad("a range that is not numbers"))?;
                    let to: u64 = b.parse().map_err(|_| bad("a range that is not numbers"))?;
                    if to < from || to - from > 100_000 {
                        return Err(bad("a range that runs backwards or is too long"));
                    }
                    for n in from..=to {
                        hosts.push(format!("{prefix}{n:0width$}{suffix}"));
                    }
                }
            }
        }
    }
    if hosts.is_empty() {
        return Err(bad("no host"));
    }
    Ok(hosts)
}

/// Waits until `file` exists and holds a line, for at most `limit`.
pub(crate) fn wait_for_file(file: &Path, limit: Duration) -> Result<String, String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            let text = text.trim();
            if !text.is_empty() {
                return Ok(text.to_string());
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not appear within {} s: did the allocation's first node start the head \
                 (`srun prism start --slurm`), and do the nodes share the submit folder?",
                file.display(),
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes `text` to `file` with only the user able to read it, whole or
/// not at all (a reader never sees half of it).
pub(crate) fn write_private(file: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let part = file.with_extension("part");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&part)
        .map_err(|e| format!("{}: {e}", part.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .and_then(|_| std::fs::rename(&part, file))
        .map_err(|e| format!("{}: {e}", file.display()))
}

/// Makes the meeting folder, readable by the user only.
pub(crate) fn make_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot make {}: {e}", dir.display())),
    }
}

/// `prism wait --slurm`: waits until every node of this allocation has
/// joined its head, then prints the shell lines that point a driver at
/// the cluster (`eval "$(prism wait --slurm)"`).
pub(crate) fn wait(args: crate::args::WaitArgs) -> Result<std::process::ExitCode, String> {
    if !args.slurm {
        return Err(
            "say which cluster to wait for: `prism wait --slurm` waits for the nodes of this \
             Slurm allocation"
                .into(),
        );
    }
    let alloc = Allocation::from_env(|k| std::env::var(k).ok())?;
    let limit = Duration::from_secs(args.timeout);
    let started = Instant::now();
    let meet = alloc.meeting_dir();
    let head = wait_for_file(&meet.join("head"), limit)?;
    let token = wait_for_file(&meet.join("token"), limit)?;
    let token = prism_gcs::Token::parse(&token)
        .map_err(|e| format!("{}: {e}", meet.join("token").display()))?;
    let want = alloc.nodes.len();
    let rt = crate::common::runtime()?;
    let mut last;
    loop {
        let alive = rt.block_on(async {
            let mut client = prism_gcs::GcsClient::connect(&head, &token).await?;
            let nodes = client.get_nodes().await?;
            Ok::<_, prism_gcs::GcsError>(
                nodes
                    .iter()
                    .filter(|n| n.state == prism_gcs::pb::NodeState::Alive as i32)
                    .count(),
            )
        });
        match alive {
            Ok(n) if n >= want => break,
            Ok(n) => last = format!("{n} of {want} node(s) joined"),
            Err(e) => last = format!("the head at {head} did not answer: {e}"),
        }
        if started.elapsed() > limit {
            return Err(format!(
                "the cluster of Slurm job {} was not whole within {} s: {last}",
                alloc.job_id, args.timeout
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // A node hears of the others with its next heartbeat's answer; a
    // driver that pins work to a node, or places a group over all of them,
    // before that is not refused: its node looks again with a fresh view.
    eprintln!(
        "prism: all {want} node(s) of Slurm job {} joined the head at {head}",
        alloc.job_id
    );
    println!("export PRISM_ADDRESS={head}");
    println!(
        "export PRISM_TEMP_DIR={}",
        crate::launch::cluster_file::shell_quote(&alloc.temp_dir().display().to_string())
    );
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn node_lists_expand_as_slurm_writes_them() {
        let e = |s: &str| expand_nodelist(s).expect(s);
        assert_eq!(e("machine[0-2]"), vec!["machine0", "machine1", "machine2"]);
        assert_eq!(
            e("gpu[08-10,12],login1"),
            vec!["gpu08", "gpu09", "gpu10", "gpu12", "login1"]
        );
        assert_eq!(e("a1,b[1-2]-ib"), vec!["a1", "b1-ib", "b2-ib"]);
        for bad in ["", "a[1-", "a[x-y]", "a[3-1]", "a,,b"] {
            assert!(expand_nodelist(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn the_allocation_is_read_from_slurms_variables() {
        let vars: HashMap<&str, &str> = [
            ("SLURM_JOB_ID", "42"),
            ("SLURM_NODEID", "1"),
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_CPUS_ON_NODE", "8"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
            ("SLURM_SUBMIT_DIR", "/home/u/run"),
        ]
        .into_iter()
        .collect();
        let a = Allocation::from_env(|k| vars.get(k).map(|v| v.to_string())).expect("reads");
        assert_eq!(a.node_index, 1);
        assert_eq!(a.nodes, vec!["n1", "n2", "n3"]);
        assert_eq!((a.cpus, a.gpus), (Some(8), Some(2)));
        assert_eq!(
            a.meeting_dir(),
            PathBuf::from("/home/u/run/.prism-slurm-42")
        );
        let mut gpus = vars.clone();
        gpus.insert("SLURM_GPUS_ON_NODE", "4");
        let a = Allocation::from_env(|k| gpus.get(k).map(|v| v.to_string())).expect("reads");
        assert_eq!(a.gpus, Some(4), "Slurm's count wins");
        let outside = Allocation::from_env(|_| None).expect_err("outside Slurm");
        assert!(outside.contains("SLURM_JOB_ID is not set"), "{outside}");
        let mut past = vars.clone();
        past.insert("SLURM_NODEID", "3");
        let e = Allocation::from_env(|k| past.get(k).map(|v| v.to_string())).expect_err("past");
        assert!(e.contains("past the 3 node(s)"), "{e}");
    }
}
