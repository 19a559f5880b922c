//! Defences of every listening socket of a Prism process.
//!
//! - **Admission**: how many connections one listener serves at once, in
//!   all and from one peer address ([`Admission`]); a connection over
//!   either limit is closed at once, before anything is read from it.
//! - **Accept errors** (most often: no file descriptor left) back off
//!   from 10 ms to a second instead of spinning ([`AcceptBackoff`]).
//! - **Refusals are logged a few lines at a time**: the first at once, then
//!   one line per interval with the count of those not shown
//!   ([`LogLimiter`]), so a flood of bad peers cannot fill the disk.
//! - **The open-file limit** is raised to its hard limit at start
//!   ([`raise_open_file_limit`]): a node holds a descriptor per worker,
//!   peer and object file, and the common soft limit of 1,024 is reached
//!   by a few hundred workers.
//!
//! The limits are tunables (`docs/config.md`), read from `PRISM_*`
//! variables by [`ConnectionLimits::from_env`].

use parking_lot::Mutex;
use prism_config::Backoff;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

prism_config::table! {
    /// Limits of every listener a Prism process opens: the raylet's TCP
    /// port, the head's control store (gRPC) and its dashboard.
    #[derive(Debug, Clone)]
    pub struct ConnectionLimits("PRISM_") {
    /// Connections one listener serves at once, from every peer together.
    /// 4,096: a cluster of a hundred nodes with a few dozen workers each
    /// talking to one node, with room to spare, and far below the open-file
    /// limit raised at start (a connection beyond it is closed at once).
    max_connections: usize = 4096;
    /// Connections one peer address may hold open on one listener at once.
    /// 1,024: every worker of a large node may reach one other node's
    /// processes, while one host alone cannot take every descriptor.
    max_connections_per_peer: usize = 1024;
    /// How long a new connection has to present its greeting (TLS and the
    /// cluster token, or an HTTP request's head) before it is closed. 5 s:
    /// a hundred times a slow round trip.
    handshake_timeout_ms: u64 = 5_000;
    /// How long an HTTP or gRPC connection (the control store, the
    /// dashboard) may stay open with no request before it is closed. 10
    /// minutes: longer than any client's keep-alive pause (the nodes' own
    /// heartbeats come every second), short enough that connections left
    /// open by clients that went away do not pile up.
    idle_connection_timeout_ms: u64 = 600_000;
    }
}

impl ConnectionLimits {
    /// The defaults with the `PRISM_*` overrides of the environment.
    pub fn from_env() -> Result<Self, prism_config::ConfigError> {
        ConnectionLimits::from_lookup(&|key| std::env::var(key).ok())
    }

    /// The defaults with the overrides `lookup` gives (a variable's name to
    /// its value); zero connections is refused.
    pub fn from_lookup(
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, prism_config::ConfigError> {
        let mut limits = ConnectionLimits::default();
        limits.apply_lookup(lookup)?;
        if limits.max_connections == 0 || limits.max_connections_per_peer == 0 {
            return Err(prism_config::ConfigError {
                key: "PRISM_MAX_CONNECTIONS / PRISM_MAX_CONNECTIONS_PER_PEER".into(),
                value: "0".into(),
                expected: "at least 1 (no connection could be served)".into(),
            });
        }
        Ok(limits)
    }

    /// [`from_env`](Self::from_env), or the defaults (with a warning
    /// naming the bad variable) where the environment is wrong: a
    /// listener must still start.
    pub fn from_env_or_default() -> Self {
        ConnectionLimits::from_env().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "using the default connection limits");
            ConnectionLimits::default()
        })
    }

    /// [`handshake_timeout_ms`](Self::handshake_timeout_ms) as a duration.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    /// [`idle_connection_timeout_ms`](Self::idle_connection_timeout_ms) as
    /// a duration.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_connection_timeout_ms)
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The listener serves `limit` connections already.
    Full {
        /// `max_connections`.
        limit: usize,
    },
    /// `peer` holds `limit` connections already.
    PeerFull {
        /// The peer's address.
        peer: IpAddr,
        /// `max_connections_per_peer`.
        limit: usize,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Full { limit } => write!(
                f,
                "{limit} connections are open already (PRISM_MAX_CONNECTIONS)"
            ),
            Refusal::PeerFull { peer, limit } => write!(
                f,
                "{peer} holds {limit} connections already (PRISM_MAX_CONNECTIONS_PER_PEER)"
            ),
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// Counts one listener's open connections against its limits.
///
/// ```
/// use prism_protocol::guard::Admission;
/// let admission = Admission::new(2, 1);
/// let peer = "10.0.0.1".parse().unwrap();
/// let first = admission.admit(peer).expect("room for one");
/// assert!(admission.admit(peer).is_err(), "one per peer");
/// drop(first);
/// assert!(admission.admit(peer).is_ok(), "its room came back");
/// ```
#[derive(Debug, Clone)]
pub struct Admission {
    counts: Arc<Mutex<Counts>>,
    max_total: usize,
    max_per_peer: usize,
}

impl Admission {
    /// A listener's admission, with these limits.
    pub fn new(max_total: usize, max_per_peer: usize) -> Self {
        Admission {
            counts: Arc::default(),
            max_total,
            max_per_peer,
        }
    }

    /// A listener's admission with `limits`.
    pub fn with_limits(limits: &ConnectionLimits) -> Self {
        Admission::new(limits.max_connections, limits.max_connections_per_peer)
    }

    /// Counts a connection from `peer`, until the returned guard drops;
    /// refused when either limit is reached.
    pub fn admit(&self, peer: IpAddr) -> Result<Admitted, Refusal> {
        let mut counts = self.counts.lock();
        if counts.total >= self.max_total {
            return Err(Refusal::Full {
                limit: self.max_total,
            });
        }
        let held = counts.per_peer.entry(peer).or_insert(0);
        if *held >= self.max_per_peer {
            return Err(Refusal::PeerFull {
                peer,
                limit: self.max_per_peer,
            });
        }
        *held += 1;
        counts.total += 1;
        Ok(Admitted {
            counts: self.counts.clone(),
            peer,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.counts.lock().total
    }
}

/// One admitted connection; its count goes back when this drops.
#[derive(Debug)]
pub struct Admitted {
    counts: Arc<Mutex<Counts>>,
    peer: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(held) = counts.per_peer.get_mut(&self.peer) {
            *held -= 1;
            if *held == 0 {
                counts.per_peer.remove(&self.peer);
            }
        }
    }
}

/// The pause after a failed `accept`: 10 ms, doubling to 1 s while the
/// failures go on, back to none after a success.
#[derive(Debug)]
pub struct AcceptBackoff {
    pause: Backoff,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            pause: Backoff::new(Self::FIRST, Self::MOST),
        }
    }
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MOST: Duration = Duration::from_secs(1);

    /// An accept failed: how long to wait before the next.
    pub fn failed(&mut self) -> Duration {
        // No deadline: there is always a next pause.
        self.pause.next_pause().unwrap_or(Self::MOST)
    }

    /// An accept succeeded.
    pub fn succeeded(&mut self) {
        self.pause.reset();
    }
}

/// Lets one line through per interval; counts the ones held back.
///
/// ```
/// use prism_protocol::guard::LogLimiter;
/// use std::time::Duration;
/// static REFUSED: LogLimiter = LogLimiter::new(Duration::from_secs(60));
/// assert_eq!(REFUSED.allow(), Some(0), "the first line goes out");
/// assert_eq!(REFUSED.allow(), None, "the next ones wait");
/// assert_eq!(REFUSED.allow(), None);
/// ```
#[derive(Debug)]
pub struct LogLimiter {
    interval: Duration,
    state: Mutex<LimiterState>,
}

#[derive(Debug)]
struct LimiterState {
    last: Option<Instant>,
    held_back: u64,
}

impl LogLimiter {
    /// A limiter letting one line through per `interval`.
    pub const fn new(interval: Duration) -> Self {
        LogLimiter {
            interval,
            state: Mutex::new(LimiterState {
                last: None,
                held_back: 0,
            }),
        }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were
    /// held back since the last one; `None` when this one is held back.
    pub fn allow(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let now = Instant::now();
        match state.last {
            Some(last) if now.duration_since(last) < self.interval => {
                state.held_back += 1;
                None
            }
            _ => {
                state.last = Some(now);
                Some(std::mem::take(&mut state.held_back))
            }
        }
    }
}

/// A connection that closes itself when its peer goes quiet: before the
/// first byte arrives within the handshake timeout, after that within the
/// idle timeout (each read or write starts the wait again). It holds its
/// listener's [`Admitted`] count until it drops. For HTTP and gRPC
/// servers, whose connections carry no greeting of Prism's own.
#[derive(Debug)]
pub struct QuietTimeout<S> {
    inner: S,
    /// Held for its drop: the listener's count goes back with the
    /// connection.
    _admitted: Option<Admitted>,
    /// When the connection is closed unless something happens before.
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    idle: Duration,
    /// Set once the first byte arrived.
    greeted: bool,
    timed_out: bool,
}

impl<S> QuietTimeout<S> {
    /// Wraps `inner`, counted by `admitted`, with `limits`' timeouts.
    pub fn new(inner: S, admitted: Option<Admitted>, limits: &ConnectionLimits) -> Self {
        QuietTimeout {
            inner,
            _admitted: admitted,
            deadline: Box::pin(tokio::time::sleep(limits.handshake_timeout())),
            idle: limits.idle_timeout(),
            greeted: false,
            timed_out: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Whether the connection was closed for being quiet.
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    fn touch(&mut self) {
        self.greeted = true;
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for QuietTimeout<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.touch();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if self.deadline.as_mut().poll(cx).is_ready() {
                    self.timed_out = true;
                    let why = if self.greeted {
                        "no request within the idle timeout (PRISM_IDLE_CONNECTION_TIMEOUT_MS)"
                    } else {
                        "nothing sent within the handshake timeout (PRISM_HANDSHAKE_TIMEOUT_MS)"
                    };
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        why,
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for QuietTimeout<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) && self.greeted {
            let next = tokio::time::Instant::now() + self.idle;
            self.deadline.as_mut().reset(next);
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A TCP listener that admits connections within [`ConnectionLimits`],
/// backs off on accept errors and logs refusals a line per interval;
/// what it accepts closes itself when quiet ([`QuietTimeout`]).
#[derive(Debug)]
pub struct GuardedListener {
    listener: tokio::net::TcpListener,
    admission: Admission,
    limits: ConnectionLimits,
    backoff: AcceptBackoff,
    /// What the listener serves, for its log lines.
    name: &'static str,
}

static GUARDED_REFUSALS: LogLimiter = LogLimiter::new(REFUSAL_LOG_INTERVAL);
static GUARDED_ACCEPT_FAILED: LogLimiter = LogLimiter::new(REFUSAL_LOG_INTERVAL);

impl GuardedListener {
    /// Guards `listener` (serving `name`, such as "the dashboard") with
    /// `limits`.
    pub fn new(
        listener: tokio::net::TcpListener,
        limits: ConnectionLimits,
        name: &'static str,
    ) -> Self {
        GuardedListener {
            admission: Admission::with_limits(&limits),
            listener,
            limits,
            backoff: AcceptBackoff::default(),
            name,
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// The limits it was made with.
    pub fn limits(&self) -> &ConnectionLimits {
        &self.limits
    }

    /// The next admitted connection, with its count; refusals and accept
    /// errors are handled (and logged) here.
    pub async fn accept_counted(
        &mut self,
    ) -> (tokio::net::TcpStream, std::net::SocketAddr, Admitted) {
        loop {
            let (tcp, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    accept_failed(&error, &mut self.backoff, self.name).await;
                    continue;
                }
            };
            self.backoff.succeeded();
            match self.admission.admit(peer.ip()) {
                Ok(admitted) => return (tcp, peer, admitted),
                Err(refusal) => log_refusal(self.name, &peer, &refusal.to_string()),
            }
        }
    }

    /// The next admitted connection, closed when quiet
    /// ([`QuietTimeout`]).
    pub async fn accept(&mut self) -> (QuietTimeout<tokio::net::TcpStream>, std::net::SocketAddr) {
        let (tcp, peer, admitted) = self.accept_counted().await;
        let _ = tcp.set_nodelay(true);
        (QuietTimeout::new(tcp, Some(admitted), &self.limits), peer)
    }
}

/// Logs that `listener` refused `peer`, a line per interval at most (with
/// the count of refusals not logged).
pub fn log_refusal(listener: &str, peer: &std::net::SocketAddr, why: &str) {
    if let Some(held_back) = GUARDED_REFUSALS.allow() {
        tracing::warn!(
            %listener,
            %peer,
            error = %why,
            refusals_not_logged = held_back,
            "refused a connection"
        );
    }
}

/// A failed accept on `listener`: logged a line per interval at most, then
/// the backoff's pause.
pub async fn accept_failed(error: &std::io::Error, backoff: &mut AcceptBackoff, listener: &str) {
    let pause = backoff.failed();
    if let Some(held_back) = GUARDED_ACCEPT_FAILED.allow() {
        tracing::warn!(
            %listener,
            %error,
            failures_not_logged = held_back,
            pause_ms = pause.as_millis() as u64,
            "accept failed (out of file descriptors? see `ulimit -n`); pausing before the next"
        );
    }
    tokio::time::sleep(pause).await;
}

/// How often each kind of refusal is logged.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Raises this process's soft limit on open files to its hard limit;
/// returns the soft limit before and after. A failure leaves the limit as
/// it was (and says why).
pub fn raise_open_file_limit() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct given, which lives here.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok((before, before));
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads the struct given, which lives here.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((before, limit.rlim_cur))
}

/// The temp folder this user's nodes, drivers and `prism` commands use
/// unless told otherwise: `/tmp/prism` for root, `/tmp/prism-<uid>` for
/// any other user, so that two users of one machine never share one (and
/// neither can plant node records in the other's).
///
/// ```
/// let dir = prism_protocol::guard::default_temp_dir();
/// assert!(dir.starts_with("/tmp") && dir.to_string_lossy().contains("prism"));
/// ```
pub fn default_temp_dir() -> std::path::PathBuf {
    // SAFETY: geteuid has no preconditions.
    match unsafe { libc::geteuid() } {
        0 => "/tmp/prism".into(),
        uid => format!("/tmp/prism-{uid}").into(),
    }
}

/// Makes `dir` (and its missing parents) readable and writable by this
/// user alone, or checks that an existing one is this user's own: a folder
/// of another user, or one other users may write to, is refused, since
/// whoever controls it can plant node records (and so choose which
/// process `prism stop` signals) or read the logs. An existing folder of
/// this user's that others may read is made private.
pub fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let refuse = |why: String| {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} {why}; Prism keeps node records, logs and sockets there, and another user \
                 could plant or read them. Choose a folder of your own with --temp-dir or \
                 PRISM_TEMP_DIR, or remove this one",
                dir.display()
            ),
        )
    };
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            // A parent made here keeps the umask's mode; the folder itself
            // is private whatever the umask.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        }
        Err(e) => Err(e),
        Ok(meta) if meta.file_type().is_symlink() => Err(refuse("is a symbolic link".into())),
        Ok(meta) if !meta.is_dir() => Err(refuse("is not a folder".into())),
        Ok(meta) => {
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if meta.uid() != me {
                return Err(refuse(format!(
                    "belongs to user id {}, not to you (user id {me})",
                    meta.uid()
                )));
            }
            let mode = meta.mode() & 0o7777;
            if mode & 0o022 != 0 {
                return Err(refuse(format!(
                    "can be written by other users (mode {mode:o})"
                )));
            }
            if mode & 0o077 != 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_refuses_past_its_total_and_names_the_variable() {
        let admission = Admission::new(2, 2);
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let _one = admission.admit(a).expect("first");
        let _two = admission.admit(b).expect("second");
        let refused = admission.admit(b).expect_err("third is over the total");
        assert_eq!(refused, Refusal::Full { limit: 2 });
        assert!(refused.to_string().contains("PRISM_MAX_CONNECTIONS"));
        assert_eq!(admission.open(), 2);
    }

    #[test]
    fn backoff_doubles_to_a_second_and_resets_after_a_success() {
        let mut backoff = AcceptBackoff::default();
        assert_eq!(backoff.failed(), Duration::from_millis(10));
        assert_eq!(backoff.failed(), Duration::from_millis(20));
        for _ in 0..20 {
            backoff.failed();
        }
        assert_eq!(backoff.failed(), Duration::from_secs(1));
        backoff.succeeded();
        assert_eq!(backoff.failed(), Duration::from_millis(10));
    }

    #[test]
    fn a_limiter_counts_the_lines_it_held_back() {
        let limiter = LogLimiter::new(Duration::from_millis(30));
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), None);
        assert_eq!(limiter.allow(), None);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(limiter.allow(), Some(2));
    }

    #[test]
    fn zero_connections_allowed_is_refused_with_the_variable() {
        let lookup = |k: &str| (k == "PRISM_MAX_CONNECTIONS").then(|| "0".to_string());
        let err = ConnectionLimits::from_lookup(&lookup).expect_err("0 serves nobody");
        assert!(err.to_string().contains("PRISM_MAX_CONNECTIONS"), "{err}");
        let lookup = |k: &str| (k == "PRISM_MAX_CONNECTIONS_PER_PEER").then(|| "3".to_string());
        let limits = ConnectionLimits::from_lookup(&lookup).expect("3 is fine");
        assert_eq!(limits.max_connections_per_peer, 3);
    }

    #[test]
    fn a_private_folder_is_made_0700_and_a_shared_one_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("prism-private-{}", std::process::id()));
        let dir = root.join("a/b");
        private_dir(&dir).expect("made");
        let mode = |p: &std::path::Path| {
            std::fs::metadata(p).expect("exists").permissions().mode() & 0o777
        };
        assert_eq!(mode(&dir), 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        private_dir(&dir).expect("ours, only readable by others: made private");
        assert_eq!(mode(&dir), 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = private_dir(&dir).expect_err("others may write to it");
        assert!(
            err.to_string().contains("can be written by other users"),
            "{err}"
        );
        assert!(err.to_string().contains("PRISM_TEMP_DIR"), "{err}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // Root can make a folder another user's, as that user would.
            std::os::unix::fs::chown(&dir, Some(65534), None).expect("chown");
            let err = private_dir(&dir).expect_err("another user's folder");
            assert!(
                err.to_string().contains("belongs to user id 65534"),
                "{err}"
            );
        }
        let link = root.join("link");
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        assert!(private_dir(&link).is_err(), "a symbolic link is refused");
        std::fs::remove_dir_all(&root).expect("clean up");
    }
}
