//! Commands on a machine over SSH (OpenSSH's `ssh` client), bounded in
//! time, with failures told apart: a host that cannot be reached, a key
//! it refuses, a command that failed there.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How to log into the machines of a cluster.
#[derive(Debug, Clone)]
pub(crate) struct Login {
    pub(crate) user: Option<String>,
    pub(crate) key: Option<PathBuf>,
    pub(crate) port: Option<u16>,
    /// The known hosts file of this cluster's machines (their keys are
    /// taken on first use and checked after).
    pub(crate) known_hosts: PathBuf,
}

/// What a command run over SSH gave.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) stdout: String,
}

/// Why a command over SSH failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SshError {
    #[error("cannot run `ssh` here ({0}): install OpenSSH's client (Debian: openssh-client)")]
    NoClient(std::io::Error),
    #[error("cannot reach {host} over SSH: {why}. Check that the machine is up, that sshd listens on port {port}, and that nothing between blocks it")]
    Unreachable {
        host: String,
        port: u16,
        why: String,
    },
    #[error("{host} refused the login of {user}: {why}. Check auth.ssh_user and auth.ssh_private_key in the cluster file, and that the key's public half is in that user's ~/.ssh/authorized_keys there")]
    Refused {
        host: String,
        user: String,
        why: String,
    },
    #[error("{step} on {host} failed (exit status {code}): {stderr}")]
    Failed {
        host: String,
        step: String,
        code: i32,
        stderr: String,
    },
    #[error("{step} on {host} took longer than {secs} s and was stopped")]
    TimedOut {
        host: String,
        step: String,
        secs: u64,
    },
}

impl Login {
    fn command(&self, host: &str, tty: bool) -> Command {
        let mut c = Command::new("ssh");
        c.args([
            "-F",
            "none",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
        ])
        .args(["-o", "StrictHostKeyChecking=accept-new"])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", self.known_hosts.display()))
        .args(["-o", "LogLevel=ERROR", "-o", "ServerAliveInterval=5"]);
        if tty {
            c.arg("-t");
        }
        if let Some(key) = &self.key {
            c.arg("-i").arg(key).args(["-o", "IdentitiesOnly=yes"]);
        }
        if let Some(port) = self.port {
            c.arg("-p").arg(port.to_string());
        }
        if let Some(user) = &self.user {
            c.arg("-l").arg(user);
        }
        c.arg(host);
        c
    }

    fn user(&self) -> String {
        self.user
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "this user".into())
    }

    /// Runs `script` with `sh` on `host`, feeding it `input`, for at most
    /// `limit`. `step` names it in errors.
    pub(crate) fn run(
        &self,
        host: &str,
        step: &str,
        script: &str,
        input: Option<&mut dyn std::io::Read>,
        limit: Duration,
    ) -> Result<Ran, SshError> {
        let mut c = self.command(host, false);
        c.arg(format!(
            "sh -c {}",
            super::cluster_file::shell_quote(script)
        ));
        let Finished {
            status,
            stdout,
            stderr,
        } = match bounded(c, input, limit) {
            Ok(f) => f,
            Err(Bounded::Spawn(e)) => return Err(SshError::NoClient(e)),
            Err(Bounded::TimedOut) => {
                return Err(SshError::TimedOut {
                    host: host.into(),
                    step: step.into(),
                    secs: limit.as_secs(),
                })
            }
        };
        if status.success() {
            return Ok(Ran { stdout });
        }
        let code = status.code().unwrap_or(-1);
        let why = stderr.trim().to_string();
        // ssh itself exits with 255 on its own failures.
        if code == 255 {
            let refused = ["Permission denied", "Too many authentication failures"];
            if refused.iter().any(|r| why.contains(r)) {
                return Err(SshError::Refused {
                    host: host.into(),
                    user: self.user(),
                    why,
                });
            }
            return Err(SshError::Unreachable {
                host: host.into(),
                port: self.port.unwrap_or(22),
                why: if why.is_empty() {
                    "ssh gave up without a message".into()
                } else {
                    why
                },
            });
        }
        Err(SshError::Failed {
            host: host.into(),
            step: step.into(),
            code,
            stderr: last_lines(&why, 20),
        })
    }

    /// Replaces this process with an SSH session on `host` running
    /// `script` (a login shell when `None`), with a terminal when this
    /// one has one. Returns only on failure.
    pub(crate) fn hand_over(&self, host: &str, script: &str) -> std::io::Error {
        use std::io::IsTerminal;
        use std::os::unix::process::CommandExt;
        let mut c = self.command(host, std::io::stdin().is_terminal());
        c.arg(script);
        c.exec()
    }
}

/// A command that ran to its end.
pub(crate) struct Finished {
    pub(crate) status: std::process::ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Why a bounded command did not run to its end.
pub(crate) enum Bounded {
    Spawn(std::io::Error),
    TimedOut,
}

/// Runs `c`, feeding it `input`, for at most `limit` (then kills it),
/// collecting its output.
pub(crate) fn bounded(
    mut c: Command,
    input: Option<&mut dyn std::io::Read>,
    limit: Duration,
) -> Result<Finished, Bounded> {
    c.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().map_err(Bounded::Spawn)?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A remote end that stops reading shows as the command's failure.
        let _ = std::io::copy(input, &mut stdin);
        let _ = stdin.flush();
    }
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let out = std::thread::spawn(move || read_all(stdout));
    let err = std::thread::spawn(move || read_all(stderr));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Bounded::TimedOut);
            }
        }
    };
    Ok(Finished {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

fn read_all(from: Option<impl std::io::Read>) -> String {
    let mut s = Vec::new();
    if let Some(mut r) = from {
        let _ = r.read_to_end(&mut s);
    }
    String::from_utf8_lossy(&s).into_owned()
}

pub(crate) fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}
