//! `prism up`, `down`, `exec`, `attach`, `submit` and `get-head-ip`: a
//! cluster brought up from a cluster file (Ray's cluster launcher).
//!
//! Everything happens over SSH from this machine. On each machine,
//! `prism up` copies this very `prism` binary (into
//! `~/.prism/bin/<its build id>/`, once), the file mounts, runs the setup
//! commands and starts Prism: the head first, then the workers at once,
//! each given the head's token through a file only its user reads
//! (`~/.prism/clusters/<name>/token`). A machine whose node runs and whose
//! fingerprint (binary, commands, mounts) is unchanged is left as it is,
//! so `prism up` run again changes nothing that is right. A user's driver
//! needs nothing installed on the workers: they fetch its program from
//! the driver, as in any cluster. `prism down` stops every node and
//! removes its session folder and the cluster's folder.

pub(crate) mod autoscaler;
pub(crate) mod cluster_file;
pub(crate) mod monitor;
pub(crate) mod podman;
pub(crate) mod provider;
pub(crate) mod ssh;

use crate::args::{LaunchArgs, LaunchExecArgs, LaunchSubmitArgs};
use cluster_file::{shell_quote, Cluster};
use podman::{Podman, PodmanProvider};
use provider::{NodeProvider, SshProvider, HEAD_TYPE_TAG};
use ssh::Login;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long one step on a machine may take (a binary's upload, setup
/// commands, a node's start).
const STEP_LIMIT: Duration = Duration::from_secs(300);
/// How long `prism up` waits for every node to join the head.
const JOIN_LIMIT: Duration = Duration::from_secs(60);

/// Stops a machine's node (and, on the head, its autoscaler first) and
/// removes its session folder and the cluster's folder.
const STOP_SCRIPT: &str = "if [ -f \"$PRISM_CLUSTER_DIR/autoscaler.pid\" ]; then \
     kill \"$(cat \"$PRISM_CLUSTER_DIR/autoscaler.pid\")\" 2>/dev/null || true; fi\n\
     if [ -x \"$PRISM\" ]; then \"$PRISM\" stop >&2 || true; \
     elif command -v prism >/dev/null; then prism stop >&2 || true; fi\n\
     rm -rf \"$PRISM_SESSION_DIR\" \"$PRISM_CLUSTER_DIR\"\n";

/// How commands reach the cluster's machines.
#[derive(Debug, Clone)]
enum Shell {
    /// Over SSH.
    Ssh(Login),
    /// Through `podman exec` into the node's container.
    Podman(Podman),
}

impl Shell {
    fn run(
        &self,
        host: &str,
        step: &str,
        script: &str,
        input: Option<&mut dyn std::io::Read>,
    ) -> Result<String, String> {
        match self {
            Shell::Ssh(login) => login
                .run(host, step, script, input, STEP_LIMIT)
                .map(|r| r.stdout)
                .map_err(|e| e.to_string()),
            Shell::Podman(p) => p
                .run(host, step, script, input, STEP_LIMIT)
                .map(|r| r.stdout),
        }
    }

    /// Replaces this process with a session on `host` running `script`
    /// with `sh`; returns only the reason it could not.
    fn hand_over(&self, host: &str, script: &str) -> String {
        match self {
            Shell::Ssh(login) => {
                let e = login.hand_over(host, &format!("sh -c {}", shell_quote(script)));
                format!("cannot run ssh: {e}")
            }
            Shell::Podman(p) => format!("cannot run podman: {}", p.hand_over(host, script)),
        }
    }
}

/// A cluster file with what acting on it needs.
#[derive(Clone)]
struct Launch {
    cluster: Cluster,
    /// The cluster file, as given.
    file: PathBuf,
    shell: Shell,
    /// The SSH key of the cluster file, resolved.
    key: Option<PathBuf>,
    /// This machine's folder for the cluster (known hosts, the
    /// provider's state).
    local_dir: PathBuf,
    /// This `prism` binary and the folder name of its build.
    binary: PathBuf,
    binary_id: String,
    /// This `prism` binary by content (what is copied is its image).
    program: prism_protocol::program::Program,
}

impl Launch {
    fn open(file: &Path) -> Result<Launch, String> {
        let cluster = Cluster::load(file)?;
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .ok_or("HOME is not set: the launcher keeps each cluster's state under ~/.prism")?;
        let local_dir = home
            .join(".prism")
            .join("clusters")
            .join(&cluster.file.cluster_name);
        std::fs::create_dir_all(&local_dir)
            .map_err(|e| format!("cannot make {}: {e}", local_dir.display()))?;
        let auth = &cluster.file.auth;
        let key = auth
            .ssh_private_key
            .as_deref()
            .map(|k| cluster_file::resolve(&cluster.dir, k));
        if let Some(k) = &key {
            if !k.is_file() {
                return Err(format!(
                    "auth.ssh_private_key {} is not a file here",
                    k.display()
                ));
            }
        }
        let binary = std::env::current_exe()
            .map_err(|e| format!("cannot find this prism binary to copy to the machines: {e}"))?;
        let program = prism_protocol::program::Program::of(&binary)
            .map_err(|e| format!("cannot read {}: {e}", binary.display()))?;
        let binary_id = program.folder_name();
        let shell = match &cluster.podman {
            Some(config) => Shell::Podman(Podman::new(
                &cluster.file.cluster_name,
                config.clone(),
                &cluster.head_ip,
                &cluster.file.provider.worker_ips,
                binary.clone(),
                &binary_id,
            )),
            None => Shell::Ssh(Login {
                user: auth.ssh_user.clone(),
                key: key.clone(),
                port: auth.ssh_port,
                known_hosts: local_dir.join("known_hosts"),
            }),
        };
        Ok(Launch {
            cluster,
            file: file.to_path_buf(),
            shell,
            key,
            local_dir,
            binary,
            binary_id,
            program,
        })
    }

    fn provider(&self) -> Result<Box<dyn NodeProvider>, String> {
        Ok(match &self.shell {
            Shell::Podman(p) => Box::new(PodmanProvider::new(p.clone())),
            Shell::Ssh(_) => Box::new(SshProvider::new(
                self.cluster.head_ip.clone(),
                self.cluster.file.provider.worker_ips.clone(),
                self.local_dir.join("nodes.json"),
            )?),
        })
    }

    /// Whether the nodes are containers of this machine (`podman`): the
    /// provider makes them, and the autoscaler runs here rather than on
    /// the head.
    fn in_containers(&self) -> bool {
        matches!(self.shell, Shell::Podman(_))
    }

    /// The lines every script on a machine starts with: where the binary
    /// and the cluster's folder are, the node's and the head's addresses,
    /// and the session folder `prism` uses there.
    fn preamble(&self, host: &str) -> String {
        let ip = if host.parse::<std::net::IpAddr>().is_ok() {
            host
        } else {
            ""
        };
        format!(
            "set -e\n\
             PRISM_BIN_DIR=\"$HOME/.prism/bin/{id}\"\n\
             PRISM=\"$PRISM_BIN_DIR/prism\"\n\
             PRISM_CLUSTER_DIR=\"$HOME/.prism/clusters/{name}\"\n\
             PRISM_NODE_IP={ip}\n\
             PRISM_HEAD_ADDRESS={head}\n\
             PRISM_ADDRESS={head}\n\
             if [ \"$(id -u)\" = 0 ]; then PRISM_SESSION_DIR=\"${{PRISM_TEMP_DIR:-/tmp/prism}}\"; \
             else PRISM_SESSION_DIR=\"${{PRISM_TEMP_DIR:-/tmp/prism-$(id -u)}}\"; fi\n\
             PATH=\"$PRISM_BIN_DIR:$PATH\"\n\
             export PRISM PRISM_CLUSTER_DIR PRISM_NODE_IP PRISM_HEAD_ADDRESS PRISM_ADDRESS PATH\n",
            id = self.binary_id,
            name = self.cluster.file.cluster_name,
            ip = shell_quote(ip),
            head = shell_quote(&self.cluster.head_address()),
        )
    }

    fn run(
        &self,
        host: &str,
        step: &str,
        script: &str,
        input: Option<&mut dyn std::io::Read>,
    ) -> Result<String, String> {
        let script = format!("{}{script}", self.preamble(host));
        self.shell.run(host, step, &script, input)
    }
}

/// Prints a step of `prism up` or `down` with its time.
fn step<T>(host: &str, what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let started = Instant::now();
    let out = f();
    let took = started.elapsed().as_secs_f64();
    match &out {
        Ok(_) => println!("  {host}: {what} ({took:.2} s)"),
        Err(_) => println!("  {host}: {what} FAILED ({took:.2} s)"),
    }
    out
}

/// What a machine has of the cluster now.
struct Probe {
    binary: bool,
    fingerprint: String,
}

impl Launch {
    fn probe(&self, host: &str) -> Result<Probe, String> {
        let out = self.run(
            host,
            "looking at the machine",
            "if [ -x \"$PRISM\" ]; then echo binary=yes; else echo binary=no; fi\n\
             echo \"fingerprint=$(cat \"$PRISM_CLUSTER_DIR/fingerprint\" 2>/dev/null || true)\"\n",
            None,
        )?;
        let value = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        Ok(Probe {
            binary: value("binary=") == "yes",
            fingerprint: value("fingerprint="),
        })
    }

    /// Copies this `prism` to `host`: its runnable image, without the
    /// debug sections (see [`prism_protocol::program`]).
    fn upload_binary(&self, host: &str) -> Result<(), String> {
        let mut file = self
            .program
            .open_image(&self.binary)
            .map_err(|e| format!("{}: {e}", self.binary.display()))?;
        self.run(
            host,
            "copying prism",
            "mkdir -p \"$PRISM_BIN_DIR\"\n\
             cat > \"$PRISM.part\"\n\
             chmod 755 \"$PRISM.part\"\n\
             mv \"$PRISM.part\" \"$PRISM\"\n\
             \"$PRISM\" --version >/dev/null || { echo \"the copied prism does not run on this machine (its system libraries differ from the machine prism up ran on)\" >&2; exit 3; }\n",
            Some(&mut file),
        )
        .map(drop)
    }

    fn copy_mounts(&self, host: &str) -> Result<(), String> {
        for (remote, local) in &self.cluster.file.file_mounts {
            let local = cluster_file::resolve(&self.cluster.dir, local);
            let target = remote_path(remote);
            if local.is_dir() {
                let mut tar = std::process::Command::new("tar")
                    .arg("-C")
                    .arg(&local)
                    .args(["-cf", "-", "."])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("cannot run tar to copy {}: {e}", local.display()))?;
                let mut out = tar.stdout.take().ok_or("tar gave no output")?;
                let copied = self.run(
                    host,
                    &format!("copying {}", local.display()),
                    &format!("mkdir -p {target}\ntar -C {target} -xf -\n"),
                    Some(&mut out),
                );
                let status = tar.wait().map_err(|e| e.to_string())?;
                copied?;
                if !status.success() {
                    return Err(format!("tar could not read {}", local.display()));
                }
            } else {
                let mut file =
                    std::fs::File::open(&local).map_err(|e| format!("{}: {e}", local.display()))?;
                self.run(
                    host,
                    &format!("copying {}", local.display()),
                    &format!("mkdir -p \"$(dirname {target})\"\ncat > {target}\n"),
                    Some(&mut file),
                )?;
            }
        }
        Ok(())
    }

    /// Runs the setup commands and (re)starts Prism on `host`; `token`
    /// goes to the machine first (a worker's), and the head's token is
    /// returned (the head's).
    fn setup_and_start(
        &self,
        host: &str,
        head: bool,
        fingerprint: &str,
        token: Option<&str>,
    ) -> Result<String, String> {
        let file = &self.cluster.file;
        let (role_setup, start) = if head {
            (&file.head_setup_commands, self.cluster.head_start())
        } else {
            (&file.worker_setup_commands, self.cluster.worker_start())
        };
        let mut script = String::from(
            "umask 077\nmkdir -p \"$PRISM_CLUSTER_DIR\"\nrm -f \"$PRISM_CLUSTER_DIR/fingerprint\"\n",
        );
        if token.is_some() {
            script.push_str("cat > \"$PRISM_CLUSTER_DIR/token\"\n");
        }
        script.push_str("umask 022\n");
        for c in file.setup_commands.iter().chain(role_setup) {
            script.push_str(c);
            script.push('\n');
        }
        script.push_str("\"$PRISM\" stop >/dev/null 2>&1 || true\n");
        for c in &start {
            script.push_str(c);
            script.push_str(" >&2\n");
        }
        script.push_str(&format!(
            "echo {} > \"$PRISM_CLUSTER_DIR/fingerprint\"\n",
            shell_quote(fingerprint)
        ));
        if head {
            script.push_str("cat \"$PRISM_SESSION_DIR/token\"\n");
        }
        let mut input = token.map(|t| std::io::Cursor::new(t.as_bytes().to_vec()));
        let out = self.run(
            host,
            "setting up and starting prism",
            &script,
            input.as_mut().map(|i| i as &mut dyn std::io::Read),
        )?;
        Ok(out.trim().to_string())
    }

    /// The head's token, read from its session folder.
    fn head_token(&self) -> Result<String, String> {
        self.run(
            &self.cluster.head_ip,
            "reading the cluster token",
            "cat \"$PRISM_SESSION_DIR/token\"\n",
            None,
        )
        .map(|t| t.trim().to_string())
    }

    /// The hosts the head lists alive (from `prism status` there).
    fn alive_hosts(&self) -> Result<Vec<String>, String> {
        let out = self.run(
            &self.cluster.head_ip,
            "asking the head for its nodes",
            "\"$PRISM\" status --format json\n",
            None,
        )?;
        let status: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| format!("the head's `prism status --format json` gave no JSON ({e})"))?;
        Ok(status["nodes"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(|n| n["state"] == "ALIVE")
            .filter_map(|n| n["node_ip"].as_str().map(str::to_string))
            .collect())
    }

    /// Brings up one machine: whatever differs from the cluster file.
    /// `token` gives a worker the cluster token, asked only when the
    /// machine needs its setup run. Returns whether anything was done, and
    /// the head's token (head).
    fn bring_up(
        &self,
        host: &str,
        head: bool,
        alive: bool,
        token: Option<&dyn Fn() -> Result<String, String>>,
    ) -> Result<(bool, Option<String>), String> {
        let probe = step(host, "checked", || self.probe(host))?;
        self.bring_up_probed(host, head, alive, token, probe)
    }

    /// [`Launch::bring_up`] once the machine was looked at.
    fn bring_up_probed(
        &self,
        host: &str,
        head: bool,
        alive: bool,
        token: Option<&dyn Fn() -> Result<String, String>>,
        probe: Probe,
    ) -> Result<(bool, Option<String>), String> {
        let role = if head { "head" } else { "worker" };
        let fingerprint = self.cluster.fingerprint(role, &self.binary_id)?;
        if alive && probe.binary && probe.fingerprint == fingerprint {
            println!("  {host}: {role} up to date, left as it is");
            return Ok((false, None));
        }
        if !probe.binary {
            step(host, "prism copied", || self.upload_binary(host))?;
        }
        if !self.cluster.file.file_mounts.is_empty() {
            step(host, "file mounts copied", || self.copy_mounts(host))?;
        }
        let token = token.map(|t| t()).transpose()?;
        let what = format!("setup run, {role} started");
        let out = step(host, &what, || {
            self.setup_and_start(host, head, &fingerprint, token.as_deref())
        })?;
        Ok((true, head.then_some(out)))
    }
}

/// The cluster token, read from the head once, when the first worker
/// that needs it asks (a `prism up` that changes no worker reads none).
struct HeadToken<'a> {
    launch: &'a Launch,
    read: std::sync::OnceLock<Result<String, String>>,
}

impl<'a> HeadToken<'a> {
    fn new(launch: &'a Launch, known: Option<String>) -> Self {
        let read = std::sync::OnceLock::new();
        if let Some(token) = known.filter(|t| !t.is_empty()) {
            let _ = read.set(Ok(token));
        }
        HeadToken { launch, read }
    }

    fn get(&self) -> Result<String, String> {
        self.read
            .get_or_init(|| {
                let head = &self.launch.cluster.head_ip;
                step(head, "token read", || self.launch.head_token())
            })
            .clone()
    }
}

impl Launch {
    /// The cluster file's fingerprint, which a running autoscaler keeps
    /// beside it (`autoscaler.sum`): any edit starts the autoscaler again.
    fn file_sum(&self) -> Result<String, String> {
        use std::hash::{Hash, Hasher};
        let text =
            std::fs::read(&self.file).map_err(|e| format!("{}: {e}", self.file.display()))?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        Ok(format!("{:016x}", h.finish()))
    }

    /// The fingerprint of the cluster file the cluster's autoscaler runs
    /// with, if it runs ("" when it was started without one).
    fn running_autoscaler(&self) -> Result<Option<String>, String> {
        if self.in_containers() {
            return Ok(local_autoscaler(&self.local_dir).map(|_| {
                std::fs::read_to_string(self.local_dir.join("autoscaler.sum"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            }));
        }
        let out = self.run(
            &self.cluster.head_ip,
            "looking for the autoscaler",
            "if [ -f \"$PRISM_CLUSTER_DIR/autoscaler.pid\" ] && \
             kill -0 \"$(cat \"$PRISM_CLUSTER_DIR/autoscaler.pid\")\" 2>/dev/null; \
             then echo \"runs $(cat \"$PRISM_CLUSTER_DIR/autoscaler.sum\" 2>/dev/null)\"; \
             else echo no; fi\n",
            None,
        )?;
        Ok(out
            .trim()
            .strip_prefix("runs")
            .map(|sum| sum.trim().to_string()))
    }

    /// Gives the head the cluster file (its key and file mounts pointing
    /// at the head's copies) and the SSH key, and (re)starts the
    /// autoscaler there, keeping the file's fingerprint `sum` beside it.
    fn start_autoscaler(&self, sum: &str) -> Result<(), String> {
        if self.in_containers() {
            self.start_local_autoscaler()?;
            let at = self.local_dir.join("autoscaler.sum");
            return std::fs::write(&at, sum).map_err(|e| format!("{}: {e}", at.display()));
        }
        let head = &self.cluster.head_ip;
        // The file as written (its fields and comments beyond what this
        // launcher reads), with the head's paths put in.
        let text = std::fs::read_to_string(&self.file)
            .map_err(|e| format!("{}: {e}", self.file.display()))?;
        let mut file: serde_norway::Value =
            serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", self.file.display()))?;
        if let Some(map) = file.as_mapping_mut() {
            let auth = map
                .entry("auth".into())
                .or_insert_with(|| serde_norway::Value::Mapping(Default::default()));
            if let Some(auth) = auth.as_mapping_mut() {
                if self.key.is_some() {
                    auth.insert("ssh_private_key".into(), "ssh_key".into());
                }
            }
            if let Some(mounts) = map.get_mut("file_mounts").and_then(|m| m.as_mapping_mut()) {
                for (remote, local) in mounts.iter_mut() {
                    *local = remote.clone();
                }
            }
        }
        let text = serde_norway::to_string(&file).map_err(|e| e.to_string())?;
        if let Some(key) = &self.key {
            let mut k = std::fs::File::open(key).map_err(|e| format!("{}: {e}", key.display()))?;
            self.run(
                head,
                "giving the head the SSH key",
                "umask 077\nmkdir -p \"$PRISM_CLUSTER_DIR\"\ncat > \"$PRISM_CLUSTER_DIR/ssh_key\"\n",
                Some(&mut k),
            )?;
        }
        let mut f = std::io::Cursor::new(text.into_bytes());
        self.run(
            head,
            "starting the autoscaler",
            &format!(
                "umask 077\nmkdir -p \"$PRISM_CLUSTER_DIR\"\n\
             cat > \"$PRISM_CLUSTER_DIR/cluster.yaml\"\n\
             if [ -f \"$PRISM_CLUSTER_DIR/autoscaler.pid\" ]; then \
               kill \"$(cat \"$PRISM_CLUSTER_DIR/autoscaler.pid\")\" 2>/dev/null || true; fi\n\
             mkdir -p \"$PRISM_SESSION_DIR/logs\"\n\
             cd \"$PRISM_CLUSTER_DIR\"\n\
             setsid \"$PRISM\" autoscaler \"$PRISM_CLUSTER_DIR/cluster.yaml\" \
               > \"$PRISM_SESSION_DIR/logs/autoscaler.log\" 2>&1 < /dev/null &\n\
             echo $! > \"$PRISM_CLUSTER_DIR/autoscaler.pid\"\n\
             echo {} > \"$PRISM_CLUSTER_DIR/autoscaler.sum\"\n",
                shell_quote(sum)
            ),
            Some(&mut f),
        )
        .map(drop)
    }
}

impl Launch {
    /// Starts the autoscaler on this machine, in the background, its
    /// output in the cluster's folder here (`autoscaler.log`).
    fn start_local_autoscaler(&self) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
        stop_local_autoscaler(&self.local_dir);
        let log_path = self.local_dir.join("autoscaler.log");
        let log =
            std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let file = std::fs::canonicalize(&self.file)
            .map_err(|e| format!("{}: {e}", self.file.display()))?;
        let child = std::process::Command::new(&self.binary)
            .arg("autoscaler")
            .arg(&file)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err)
            // Not stopped with the terminal's process group.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start the autoscaler: {e}"))?;
        let pid_path = self.local_dir.join("autoscaler.pid");
        std::fs::write(&pid_path, child.id().to_string())
            .map_err(|e| format!("{}: {e}", pid_path.display()))
    }
}

/// The pid of the autoscaler running on this machine for the cluster whose
/// folder here is `dir`, if one runs.
fn local_autoscaler(dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("autoscaler.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    (args.get(1) == Some(&b"autoscaler".as_slice())).then_some(pid)
}

/// Stops the autoscaler running on this machine for the cluster whose
/// folder here is `dir`, waiting up to 5 s for it to end.
fn stop_local_autoscaler(dir: &Path) {
    let Some(pid) = local_autoscaler(dir) else {
        return;
    };
    let _ = std::process::Command::new("kill")
        .arg(pid.to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while local_autoscaler(dir).is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(dir.join("autoscaler.pid"));
}

/// The path of `remote` for a shell there (`~/x` in the home folder).
fn remote_path(remote: &str) -> String {
    match remote.strip_prefix("~/") {
        Some(rest) => format!("\"$HOME\"/{}", shell_quote(rest)),
        None => shell_quote(remote),
    }
}

/// `prism up CLUSTER_FILE`.
pub(crate) fn up(args: LaunchArgs) -> Result<ExitCode, String> {
    let started = Instant::now();
    let l = Launch::open(&args.cluster_file)?;
    let c = &l.cluster;
    println!(
        "Cluster {}: head {}, {} worker(s)",
        c.file.cluster_name,
        c.head_ip,
        c.initial_workers().len()
    );
    let mut provider = l.provider()?;
    let known: Vec<String> = provider.nodes()?.into_iter().map(|n| n.host).collect();
    if !known.contains(&c.head_ip) {
        if l.in_containers() {
            step(&c.head_ip, "container made", || {
                provider.create_nodes(HEAD_TYPE_TAG, 1)
            })?;
        } else {
            provider.create_nodes(HEAD_TYPE_TAG, 1)?;
        }
    }
    // The head first: whether it runs (from its own status), what it
    // has, and the autoscaler it runs, looked at all at once.
    let (head_alive, head_probe, running) = std::thread::scope(|s| {
        let alive = s.spawn(|| l.alive_hosts().unwrap_or_default());
        let running = s.spawn(|| {
            if c.autoscales() {
                l.running_autoscaler().unwrap_or(None)
            } else {
                None
            }
        });
        let probe = step(&c.head_ip, "checked", || l.probe(&c.head_ip));
        let alive = alive.join().unwrap_or_default();
        (alive, probe, running.join().unwrap_or(None))
    });
    let head_runs = head_alive.contains(&c.head_ip);
    let (head_changed, token) =
        l.bring_up_probed(&c.head_ip, true, head_runs, None, head_probe?)?;
    let token = HeadToken::new(&l, token);
    // The autoscaler runs with the cluster file as it was when it started:
    // an edited file (node types, limits, timeouts) starts it again.
    let mut autoscaler_restarted = false;
    if c.autoscales() {
        let sum = l.file_sum()?;
        match running {
            Some(ran) if !head_changed && ran == sum => {}
            Some(_) if !head_changed => {
                step(
                    &c.head_ip,
                    "autoscaler restarted (the cluster file changed)",
                    || l.start_autoscaler(&sum),
                )?;
                autoscaler_restarted = true;
            }
            _ => step(&c.head_ip, "autoscaler started", || {
                l.start_autoscaler(&sum)
            })?,
        }
    }
    let alive = if head_changed { Vec::new() } else { head_alive };
    let wanted = c.initial_workers();
    let missing: Vec<String> = wanted
        .iter()
        .filter(|h| !known.contains(h))
        .cloned()
        .collect();
    if !missing.is_empty() {
        let what = format!("{} worker container(s) made", missing.len());
        let made = if l.in_containers() {
            step(&missing.join(", "), &what, || {
                provider.create_nodes(&c.worker_type, missing.len())
            })?
        } else {
            provider.create_nodes(&c.worker_type, missing.len())?
        };
        debug_assert_eq!(made.len(), missing.len());
    }
    // The workers at once.
    let results: Vec<Result<bool, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = wanted
            .iter()
            .map(|host| {
                let (l, token, alive) = (&l, &token, &alive);
                s.spawn(move || {
                    let runs = alive.iter().any(|h| h == host);
                    let token = || token.get();
                    l.bring_up(host, false, runs, Some(&token)).map(|(c, _)| c)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a worker's bring-up panicked".into()))
            })
            .collect()
    });
    let mut failed = Vec::new();
    for (host, r) in wanted.iter().zip(&results) {
        if let Err(e) = r {
            failed.push(format!("{host}: {e}"));
        }
    }
    if !failed.is_empty() {
        return Err(format!(
            "{} machine(s) could not be brought up:\n  {}\nFix what is named and run `prism up` \
             again: what is already up is left as it is.",
            failed.len(),
            failed.join("\n  ")
        ));
    }
    let changed =
        head_changed || autoscaler_restarted || results.iter().any(|r| matches!(r, Ok(true)));
    if changed {
        step(&c.head_ip, "every node joined", || {
            let deadline = Instant::now() + JOIN_LIMIT;
            loop {
                let alive = l.alive_hosts()?;
                let missing: Vec<&String> = std::iter::once(&c.head_ip)
                    .chain(&wanted)
                    .filter(|h| !alive.contains(h))
                    .collect();
                if missing.is_empty() {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "{} did not join the head within {} s; see the node's logs in its \
                         session folder there (/tmp/prism/logs for root, \
                         /tmp/prism-<uid>/logs for others)",
                        missing
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        JOIN_LIMIT.as_secs(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })?;
    }
    println!(
        "Cluster {} is up ({:.2} s{}). Its head: {}\n  prism exec {} -- prism status\n  prism submit {} ./my_driver",
        c.file.cluster_name,
        started.elapsed().as_secs_f64(),
        if changed { "" } else { ", nothing to change" },
        c.head_address(),
        args.cluster_file.display(),
        args.cluster_file.display(),
    );
    Ok(ExitCode::SUCCESS)
}

/// `prism down CLUSTER_FILE`: stops every node (workers first) and removes
/// its session folder and the cluster's folder.
pub(crate) fn down(args: LaunchArgs) -> Result<ExitCode, String> {
    let l = Launch::open(&args.cluster_file)?;
    let c = &l.cluster;
    let mut provider = l.provider()?;
    let mut hosts: Vec<String> = provider.nodes()?.into_iter().map(|n| n.host).collect();
    // Machines of the file that this machine has no record of may still
    // run a node (another machine ran `prism up`): they are stopped too.
    // (Podman lists every container of the cluster.)
    if !l.in_containers() {
        for h in std::iter::once(&c.head_ip).chain(&c.file.provider.worker_ips) {
            if !hosts.contains(h) {
                hosts.push(h.clone());
            }
        }
    }
    let stop = STOP_SCRIPT;
    // The autoscaler first: it would start workers again.
    stop_local_autoscaler(&l.local_dir);
    let _ = l.run(
        &c.head_ip,
        "stopping the autoscaler",
        "if [ -f \"$PRISM_CLUSTER_DIR/autoscaler.pid\" ]; then \
         kill \"$(cat \"$PRISM_CLUSTER_DIR/autoscaler.pid\")\" 2>/dev/null || true; fi\n",
        None,
    );
    let (head, workers): (Vec<String>, Vec<String>) =
        hosts.into_iter().partition(|h| *h == c.head_ip);
    let results: Vec<(String, Result<(), String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter()
            .map(|host| {
                let l = &l;
                s.spawn(move || {
                    let r = step(host, "stopped, folders removed", || {
                        l.run(host, "stopping prism", stop, None).map(drop)
                    });
                    (host.clone(), r)
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut failed = Vec::new();
    for (host, r) in results.into_iter().chain(head.iter().map(|host| {
        let r = step(host, "stopped, folders removed", || {
            l.run(host, "stopping prism", stop, None).map(drop)
        });
        (host.clone(), r)
    })) {
        match r {
            Ok(()) => provider.terminate_node(&host)?,
            Err(e) => failed.push(format!("{host}: {e}")),
        }
    }
    if !failed.is_empty() {
        return Err(format!(
            "{} machine(s) could not be stopped (run `prism down` again once they are \
             reachable):\n  {}",
            failed.len(),
            failed.join("\n  ")
        ));
    }
    provider.finish()?;
    println!("Cluster {} is down.", c.file.cluster_name);
    Ok(ExitCode::SUCCESS)
}

/// `prism exec CLUSTER_FILE -- COMMAND...`: runs a command on the head,
/// with `prism` on its PATH and `PRISM_ADDRESS` naming the head.
pub(crate) fn exec(args: LaunchExecArgs) -> Result<ExitCode, String> {
    if args.command.is_empty() {
        return Err(
            "give the command to run after --, such as `prism exec cluster.yaml -- prism status`"
                .into(),
        );
    }
    let l = Launch::open(&args.cluster_file)?;
    let command: Vec<String> = args.command.iter().map(|a| shell_quote(a)).collect();
    let script = format!(
        "{}cd \"$HOME\"\nexec {}\n",
        l.preamble(&l.cluster.head_ip),
        command.join(" ")
    );
    Err(l.shell.hand_over(&l.cluster.head_ip, &script))
}

/// `prism attach CLUSTER_FILE`: a shell on the head.
pub(crate) fn attach(args: LaunchArgs) -> Result<ExitCode, String> {
    let l = Launch::open(&args.cluster_file)?;
    let script = format!(
        "{}cd \"$HOME\"\nexec \"${{SHELL:-/bin/sh}}\" -l\n",
        l.preamble(&l.cluster.head_ip)
    );
    Err(l.shell.hand_over(&l.cluster.head_ip, &script))
}

/// `prism submit CLUSTER_FILE PROGRAM [ARGS...]`: copies the program to
/// the head and runs it there as a job (`prism job submit`), following
/// its output.
pub(crate) fn submit(args: LaunchSubmitArgs) -> Result<ExitCode, String> {
    let l = Launch::open(&args.cluster_file)?;
    let name = args
        .program
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("{} names no file", args.program.display()))?
        .to_string();
    let mut file = std::fs::File::open(&args.program)
        .map_err(|e| format!("cannot read the program {}: {e}", args.program.display()))?;
    let head = &l.cluster.head_ip;
    let remote = format!("\"$PRISM_CLUSTER_DIR/programs/{name}\"");
    step(head, &format!("{name} copied"), || {
        l.run(
            head,
            "copying the program",
            &format!(
                "mkdir -p \"$PRISM_CLUSTER_DIR/programs\"\ncat > {remote}.part\nchmod 755 {remote}.part\nmv {remote}.part {remote}\n"
            ),
            Some(&mut file),
        )
        .map(drop)
    })?;
    let program_args: Vec<String> = args.args.iter().map(|a| shell_quote(a)).collect();
    let script = format!(
        "{}cd \"$HOME\"\nexec \"$PRISM\" job submit -- {remote} {}\n",
        l.preamble(head),
        program_args.join(" ")
    );
    Err(l.shell.hand_over(head, &script))
}

/// `prism get-head-ip CLUSTER_FILE`.
pub(crate) fn get_head_ip(args: LaunchArgs) -> Result<ExitCode, String> {
    let cluster = Cluster::load(&args.cluster_file)?;
    println!("{}", cluster.head_ip);
    Ok(ExitCode::SUCCESS)
}
