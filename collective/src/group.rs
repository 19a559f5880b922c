//! [`ProcessGroup`]: the public face of the collective layer.

use super::config::{CollectiveConfig, TransportChoice};
use super::element::{Element, ReduceOp};
use super::error::{CollectiveError, OpKind, Result};
use super::ops::{self, Call};
use super::rendezvous::{local_host_id, PeerRecord, Rendezvous, TcpRendezvous};
use super::transport::hybrid::HybridMesh;
use super::transport::shm::ShmMesh;
use super::transport::tcp::{self, TcpMesh};
use super::transport::tls::GroupTls;
use super::transport::Mesh;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The largest group this module forms. Rendezvous, the full mesh of links
/// and the small-message path are all sized for tens of ranks per group.
pub const MAX_WORLD_SIZE: usize = 1024;

/// Who this process is in which group, and how to find the others.
///
/// ```
/// use prism_collective::GroupOptions;
/// use std::time::Duration;
///
/// let options = GroupOptions::new(0, 4, "10.0.0.1:29500")
///     .group_name("gradients")
///     .timeout(Duration::from_secs(30));
/// assert_eq!(options.world_size(), 4);
/// ```
#[derive(Clone, Debug)]
pub struct GroupOptions {
    rank: usize,
    world_size: usize,
    master: String,
    group_name: String,
    config: CollectiveConfig,
    tls: Option<GroupTls>,
}

impl GroupOptions {
    /// Rank `rank` of `world_size`, meeting the others at `master`
    /// (`host:port`, where rank 0 listens), with the default configuration.
    pub fn new(rank: usize, world_size: usize, master: impl Into<String>) -> Self {
        GroupOptions {
            rank,
            world_size,
            master: master.into(),
            group_name: "default".to_string(),
            config: CollectiveConfig::default(),
            tls: None,
        }
    }

    /// Options from the environment, as torch.distributed's `env://`:
    /// `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, plus every
    /// `PRISM_COLLECTIVE_*` override.
    pub fn from_env() -> Result<Self> {
        let number = |name: &'static str| -> Result<usize> {
            let value = std::env::var(name).map_err(|_| CollectiveError::MissingEnv { name })?;
            value
                .trim()
                .parse()
                .map_err(|_| CollectiveError::InvalidConfig {
                    key: name.to_string(),
                    value,
                    expected: "a non-negative integer".into(),
                })
        };
        let rendezvous = TcpRendezvous::from_env()?;
        Ok(
            GroupOptions::new(number("RANK")?, number("WORLD_SIZE")?, rendezvous.master())
                .config(CollectiveConfig::from_env()?),
        )
    }

    /// Names the group; ranks joining with another name are refused, so two
    /// jobs given the same master port by mistake fail instead of mixing.
    pub fn group_name(mut self, name: impl Into<String>) -> Self {
        self.group_name = name.into();
        self
    }

    /// Replaces the configuration.
    pub fn config(mut self, config: CollectiveConfig) -> Self {
        self.config = config;
        self
    }

    /// Runs mutual TLS on the TCP links between ranks of different hosts
    /// (links within one host are not encrypted). Every rank of the group
    /// must be given TLS, or none: a rank that meets a peer speaking the
    /// other way fails with [`CollectiveError::Tls`].
    pub fn tls(mut self, tls: GroupTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the bound on rendezvous and on every call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout_ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        self
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    fn validate(&self) -> Result<()> {
        if self.world_size == 0 || self.world_size > MAX_WORLD_SIZE {
            return Err(CollectiveError::InvalidWorldSize {
                world_size: self.world_size,
                max: MAX_WORLD_SIZE,
            });
        }
        if self.rank >= self.world_size {
            return Err(CollectiveError::InvalidRank {
                rank: self.rank,
                world_size: self.world_size,
            });
        }
        let name_ok = !self.group_name.is_empty()
            && self.group_name.len() <= 128
            && self.group_name.chars().all(|c| c.is_ascii_graphic());
        if !name_ok {
            return Err(CollectiveError::InvalidGroupName {
                name: self.group_name.clone(),
            });
        }
        Ok(())
    }
}

struct State {
    /// `None` for a group of one.
    mesh: Option<Box<dyn Mesh>>,
    seq: u32,
    broken: Option<Arc<CollectiveError>>,
}

struct Shared {
    /// Unique among the groups of this process, never reused.
    #[cfg(feature = "cuda")]
    id: u64,
    rank: usize,
    world_size: usize,
    /// The order in which rings visit the ranks: the ranks of each host
    /// together, so a ring crosses between hosts as few times as it can.
    ring_order: Vec<usize>,
    config: CollectiveConfig,
    /// The bound on each call; starts as `config.timeout_ms`.
    timeout_ms: AtomicU64,
    transport: &'static str,
    /// Links to other ranks that run TLS.
    encrypted_links: usize,
    state: Mutex<State>,
    /// Non-blocking calls queued or running.
    pending: Mutex<usize>,
    idle: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in a collective leaves no half-updated state worth refusing:
    // the mesh is marked broken by the error path, or the call never began.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    fn execute<R>(&self, f: impl FnOnce(&mut Call<'_>) -> Result<R>) -> Result<R> {
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        if let Some(first) = &state.broken {
            return Err(CollectiveError::GroupBroken {
                first: first.clone(),
            });
        }
        let Some(mesh) = state.mesh.as_deref_mut() else {
            unreachable!("groups of one return before reaching the mesh")
        };
        state.seq = state.seq.wrapping_add(1);
        let mut call = Call {
            mesh,
            config: &self.config,
            rank: self.rank,
            world_size: self.world_size,
            ring_order: &self.ring_order,
            seq: state.seq,
            deadline: Instant::now() + self.timeout(),
            timeout: self.timeout(),
        };
        let result = f(&mut call);
        if let Err(e) = &result {
            if e.breaks_group() {
                call.mesh.abort();
                state.broken = Some(Arc::new(e.clone()));
            }
        }
        result
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        if self.world_size == 1 {
            return Ok(());
        }
        self.execute(|call| ops::all_reduce(call, buf, op))
    }

    fn reduce_scatter<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<Range<usize>> {
        if self.world_size == 1 {
            return Ok(0..buf.len());
        }
        self.execute(|call| ops::reduce_scatter(call, buf, op))
    }

    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        if self.world_size == 1 {
            if output.len() != input.len() {
                return Err(CollectiveError::BufferLength {
                    op: OpKind::AllGather,
                    expected: input.len(),
                    actual: output.len(),
                });
            }
            output.copy_from_slice(input);
            return Ok(());
        }
        if output.len() != input.len() * self.world_size {
            // Checked here too so that a bad call does not consume a
            // sequence number.
            return Err(CollectiveError::BufferLength {
                op: OpKind::AllGather,
                expected: input.len() * self.world_size,
                actual: output.len(),
            });
        }
        self.execute(|call| ops::all_gather(call, input, output))
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        if root >= self.world_size {
            return Err(CollectiveError::InvalidRoot {
                root,
                world_size: self.world_size,
            });
        }
        if self.world_size == 1 {
            return Ok(());
        }
        self.execute(|call| ops::broadcast(call, buf, root))
    }

    fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let n = self.world_size;
        if !input.len().is_multiple_of(n) || output.len() != input.len() {
            return Err(CollectiveError::BufferLength {
                op: OpKind::AllToAll,
                expected: input.len().div_ceil(n) * n,
                actual: if !input.len().is_multiple_of(n) {
                    input.len()
                } else {
                    output.len()
                },
            });
        }
        if n == 1 {
            output.copy_from_slice(input);
            return Ok(());
        }
        self.execute(|call| ops::all_to_all(call, input, output))
    }

    fn barrier(&self) -> Result<()> {
        if self.world_size == 1 {
            return Ok(());
        }
        self.execute(ops::barrier)
    }

    /// Waits until every queued non-blocking call has finished, so that a
    /// blocking call keeps its place in the group's order.
    fn wait_idle(&self, op: OpKind) -> Result<()> {
        let mut pending = lock(&self.pending);
        // Each queued call is bounded by the timeout; allow all of them.
        let bound = self.timeout() * (*pending as u32 + 1) + Duration::from_secs(1);
        let until = Instant::now() + bound;
        while *pending > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CollectiveError::Timeout {
                    op,
                    timeout: self.timeout(),
                });
            }
            pending = self
                .idle
                .wait_timeout(pending, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        Ok(())
    }
}

/// Decrements the pending count even if a queued call panics.
struct PendingGuard(Arc<Shared>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let mut pending = lock(&self.0.pending);
        *pending = pending.saturating_sub(1);
        self.0.idle.notify_all();
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A group of processes that run collectives together.
///
/// # Ordering
///
/// Every rank must make the same calls in the same order, with buffers of
/// the same length and type (the ranks check this and fail with
/// [`CollectiveError::CallMismatch`]). Non-blocking calls run one after
/// another on the group's own thread, in the order they were made; a
/// blocking call first waits for them, so it keeps its place.
///
/// # Timeouts
///
/// Every call, and the rendezvous in [`join`](Self::join), is bounded by the
/// configured timeout (`PRISM_COLLECTIVE_TIMEOUT_MS`, default 5 minutes). A
/// peer that dies is usually noticed at once (its connection closes), a hung
/// one at the timeout.
///
/// # Failures
///
/// An error while bytes are moving aborts the group on every rank (see
/// [`CollectiveError`]); create a new group to go on. Errors in the
/// arguments (a wrong length, a bad root) leave it usable.
///
/// # Example
///
/// ```
/// use prism_collective::{GroupOptions, ProcessGroup, ReduceOp};
///
/// # fn main() -> Result<(), prism_collective::CollectiveError> {
/// // Every process runs this with its own rank; a group of one is complete.
/// let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
/// let mut weights = vec![0.5f32; 4];
/// group.broadcast(&mut weights, 0)?;
///
/// let pending = group.all_reduce_async(vec![1.0f64; 1024], ReduceOp::Sum);
/// // ... compute the next bucket of gradients here ...
/// let summed = pending.wait()?;
/// assert_eq!(summed[0], 1.0);
/// group.barrier()?;
/// # Ok(())
/// # }
/// ```
pub struct ProcessGroup {
    shared: Arc<Shared>,
    jobs: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
}

impl fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.shared.rank)
            .field("world_size", &self.shared.world_size)
            .field("transport", &self.shared.transport)
            .finish()
    }
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    std::process::id().hash(&mut h);
    Instant::now().hash(&mut h);
    h.finish()
}

/// Rendezvous, one TCP connection per pair, then the transport: shared
/// memory with the ranks on this host and TCP with the others (unless TCP
/// is forced).
fn connect(
    rank: usize,
    world_size: usize,
    group_name: &str,
    config: &CollectiveConfig,
    tls: Option<&GroupTls>,
    rendezvous: &dyn Rendezvous,
    deadline: Instant,
) -> Result<(Box<dyn Mesh>, Vec<usize>, usize)> {
    let listener = tcp::bind_data_listener()?;
    let port = listener
        .local_addr()
        .map_err(|e| CollectiveError::io(None, "reading the peer listener address", e))?
        .port();
    let host_id = match &config.host_id {
        Some(id) if !id.is_empty() && id.chars().all(|c| c.is_ascii_graphic()) => id.clone(),
        Some(id) => {
            return Err(CollectiveError::InvalidConfig {
                key: "host_id".into(),
                value: id.clone(),
                expected: "1 to 256 printable characters without spaces".into(),
            })
        }
        None => local_host_id(),
    };
    let me = PeerRecord {
        rank,
        data_addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        host_id,
        pid: std::process::id(),
        nonce: random_u64(),
    };
    let table = rendezvous.exchange(group_name, world_size, me, deadline)?;
    if table.len() != world_size || table.iter().enumerate().any(|(i, r)| r.rank != i) {
        return Err(CollectiveError::Protocol {
            peer: 0,
            detail: "rendezvous returned an incomplete table",
        });
    }
    let nonce = table[0].nonce;
    let mut streams = tcp::connect_mesh(rank, &table, listener, tls, deadline)?;
    let encrypted = streams.iter().flatten().filter(|s| s.tls.is_some()).count();
    let members: Vec<usize> = (0..world_size)
        .filter(|p| table[*p].host_id == table[rank].host_id)
        .collect();
    let order = ring_order(&table);
    let mut ring_next = vec![0; world_size];
    for (i, r) in order.iter().enumerate() {
        ring_next[*r] = order[(i + 1) % world_size];
    }
    let mesh: Box<dyn Mesh> = match config.transport {
        TransportChoice::Tcp => Box::new(TcpMesh::new(streams, config)?),
        TransportChoice::SharedMemory if members.len() < world_size => {
            return Err(CollectiveError::TransportUnavailable {
                transport: "shm",
                reason: "the ranks are not all on one host",
            })
        }
        _ if members.len() == world_size => {
            // One host: no link is encrypted, and shared memory takes the
            // sockets as control streams.
            let control = streams.into_iter().map(|s| s.map(|s| s.tcp)).collect();
            Box::new(ShmMesh::new(
                rank, nonce, &members, &ring_next, control, config, deadline,
            )?)
        }
        _ if members.len() == 1 => Box::new(TcpMesh::new(streams, config)?),
        _ => {
            // Some peers share this host: shared memory with them, TCP with
            // the rest. The control streams of local peers go to the
            // shared-memory mesh.
            let local: Vec<bool> = (0..world_size).map(|p| members.contains(&p)).collect();
            let local_streams = (0..world_size)
                .map(|p| {
                    if local[p] {
                        streams[p].take().map(|s| s.tcp)
                    } else {
                        None
                    }
                })
                .collect();
            let shm = ShmMesh::new(
                rank,
                nonce,
                &members,
                &ring_next,
                local_streams,
                config,
                deadline,
            )?;
            let tcp = TcpMesh::new(streams, config)?;
            let spin = Duration::from_micros(config.shm_spin_us);
            Box::new(HybridMesh::new(shm, tcp, local, spin))
        }
    };
    Ok((mesh, order, encrypted))
}

/// The ranks ordered by host (hosts in order of their lowest rank), then by
/// rank: every rank computes the same order from the same table.
fn ring_order(table: &[PeerRecord]) -> Vec<usize> {
    let mut hosts: Vec<&str> = Vec::new();
    for record in table {
        if !hosts.contains(&record.host_id.as_str()) {
            hosts.push(&record.host_id);
        }
    }
    let host_of = |r: usize| {
        hosts
            .iter()
            .position(|h| *h == table[r].host_id)
            .unwrap_or(0)
    };
    let mut order: Vec<usize> = (0..table.len()).collect();
    order.sort_by_key(|r| (host_of(*r), *r));
    order
}

impl ProcessGroup {
    /// Joins the group described by `options`, meeting at its master address
    /// (rank 0 listens there). Returns once every rank has joined and every
    /// link is up, or with an error within the timeout.
    pub fn join(options: GroupOptions) -> Result<ProcessGroup> {
        let rendezvous = TcpRendezvous::new(options.master.clone());
        Self::join_with(options, &rendezvous)
    }

    /// Joins with `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` from
    /// the environment (see [`GroupOptions::from_env`]).
    pub fn from_env() -> Result<ProcessGroup> {
        Self::join(GroupOptions::from_env()?)
    }

    /// Joins through any [`Rendezvous`], for instance one backed by the
    /// cluster's key-value store.
    pub fn join_with(options: GroupOptions, rendezvous: &dyn Rendezvous) -> Result<ProcessGroup> {
        options.validate()?;
        let GroupOptions {
            rank,
            world_size,
            group_name,
            config,
            tls,
            ..
        } = options;
        let deadline = Instant::now() + config.timeout();
        let (mesh, ring_order, encrypted_links) = if world_size == 1 {
            (None, vec![0], 0)
        } else {
            let (mesh, order, encrypted) = connect(
                rank,
                world_size,
                &group_name,
                &config,
                tls.as_ref(),
                rendezvous,
                deadline,
            )?;
            (Some(mesh), order, encrypted)
        };
        let transport = mesh.as_ref().map_or("local", |m| m.name());
        #[cfg(feature = "cuda")]
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let shared = Arc::new(Shared {
            #[cfg(feature = "cuda")]
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            rank,
            world_size,
            ring_order,
            timeout_ms: AtomicU64::new(config.timeout_ms),
            config,
            transport,
            encrypted_links,
            state: Mutex::new(State {
                mesh,
                seq: 0,
                broken: None,
            }),
            pending: Mutex::new(0),
            idle: Condvar::new(),
        });
        let (jobs, queue) = mpsc::channel::<Job>();
        let worker = std::thread::Builder::new()
            .name(format!("prism-collective-{rank}"))
            .spawn(move || {
                // Ends when the group drops its sender.
                for job in queue {
                    job();
                }
            })
            .map_err(|e| CollectiveError::io(None, "starting the group's thread", e))?;
        Ok(ProcessGroup {
            shared,
            jobs: Some(jobs),
            worker: Some(worker),
        })
    }

    /// An id unique among this process's groups, for state kept per group
    /// (such as a group's CUDA path).
    #[cfg(feature = "cuda")]
    pub(crate) fn id(&self) -> u64 {
        self.shared.id
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.shared.world_size
    }

    /// The transport in use: `"shm"`, `"tcp"`, or `"local"` for a group of
    /// one.
    pub fn transport(&self) -> &'static str {
        self.shared.transport
    }

    /// How many of this rank's links to other ranks run TLS: those to
    /// ranks on other hosts, when the group was given
    /// [`GroupOptions::tls`]; 0 otherwise.
    pub fn encrypted_links(&self) -> usize {
        self.shared.encrypted_links
    }

    /// Replaces every element of `buf` with its reduction over all ranks.
    ///
    /// ```
    /// # use prism_collective::{GroupOptions, ProcessGroup, ReduceOp};
    /// # let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut grads = vec![0.25f32, -1.0, 4.0];
    /// group.all_reduce(&mut grads, ReduceOp::Mean)?; // the mean over ranks
    /// # assert_eq!(grads, [0.25, -1.0, 4.0]);
    /// # Ok::<(), prism_collective::CollectiveError>(())
    /// ```
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.shared.wait_idle(OpKind::AllReduce)?;
        self.shared.all_reduce(buf, op)
    }

    /// Reduces `buf` over all ranks, leaving this rank's segment (the
    /// returned range, [`segment_range`](super::segment_range)`(buf.len(),
    /// world_size, rank)`) fully reduced; the rest of `buf` holds partial
    /// results.
    ///
    /// ```
    /// # use prism_collective::{GroupOptions, ProcessGroup, ReduceOp};
    /// # let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut buf = vec![1i64; 10];
    /// let mine = group.reduce_scatter(&mut buf, ReduceOp::Sum)?;
    /// let my_part = &buf[mine]; // reduced over all ranks
    /// # assert_eq!(my_part.len(), 10);
    /// # Ok::<(), prism_collective::CollectiveError>(())
    /// ```
    pub fn reduce_scatter<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<Range<usize>> {
        self.shared.wait_idle(OpKind::ReduceScatter)?;
        self.shared.reduce_scatter(buf, op)
    }

    /// Fills `output` (`world_size * input.len()` elements) with every rank's
    /// `input`, in rank order.
    ///
    /// ```
    /// # use prism_collective::{GroupOptions, ProcessGroup};
    /// # let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mine = [group.rank() as u8; 4];
    /// let mut all = vec![0u8; 4 * group.world_size()];
    /// group.all_gather(&mine, &mut all)?;
    /// # assert_eq!(all, [0u8; 4]);
    /// # Ok::<(), prism_collective::CollectiveError>(())
    /// ```
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.shared.wait_idle(OpKind::AllGather)?;
        self.shared.all_gather(input, output)
    }

    /// Copies `root`'s `buf` into every other rank's `buf`.
    ///
    /// ```
    /// # use prism_collective::{GroupOptions, ProcessGroup};
    /// # let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut weights = vec![0.0f64; 8];
    /// if group.rank() == 0 {
    ///     weights.fill(0.5);
    /// }
    /// group.broadcast(&mut weights, 0)?;
    /// assert_eq!(weights, [0.5; 8]);
    /// # Ok::<(), prism_collective::CollectiveError>(())
    /// ```
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.shared.wait_idle(OpKind::Broadcast)?;
        self.shared.broadcast(buf, root)
    }

    /// Returns once every rank has entered the barrier.
    ///
    /// ```
    /// # use prism_collective::{GroupOptions, ProcessGroup};
    /// # let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
    /// group.barrier()?;
    /// # Ok::<(), prism_collective::CollectiveError>(())
    /// ```
    pub fn barrier(&self) -> Result<()> {
        self.shared.wait_idle(OpKind::Barrier)?;
        self.shared.barrier()
    }

    /// Exchanges blocks: `input` and `output` are `world_size` equal blocks;
    /// block `j` of this rank's `input` becomes block `i` (this rank's index)
    /// of rank `j`'s `output`. The transpose that a device-side reduction (or
    /// a mixture-of-experts layer) needs.
    ///
    /// ```
    /// # use prism_collective::{GroupOptions, ProcessGroup};
    /// # let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let n = group.world_size();
    /// let input: Vec<i32> = (0..2 * n as i32).collect(); // n blocks of 2
    /// let mut output = vec![0; 2 * n];
    /// group.all_to_all(&input, &mut output)?;
    /// # assert_eq!(output, input);
    /// # Ok::<(), prism_collective::CollectiveError>(())
    /// ```
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.shared.wait_idle(OpKind::AllToAll)?;
        self.shared.all_to_all(input, output)
    }

    /// Sets the bound on each later call (the rendezvous used the
    /// configured timeout). Every rank should set the same value.
    ///
    /// ```
    /// # use prism_collective::{GroupOptions, ProcessGroup};
    /// # use std::time::Duration;
    /// let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
    /// group.set_timeout(Duration::from_secs(30));
    /// assert_eq!(group.timeout(), Duration::from_secs(30));
    /// # Ok::<(), prism_collective::CollectiveError>(())
    /// ```
    pub fn set_timeout(&self, timeout: Duration) {
        let ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        self.shared.timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// The bound on each call.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout()
    }

    /// The configuration this group was formed with.
    pub fn config(&self) -> &CollectiveConfig {
        &self.shared.config
    }

    /// [`all_reduce`](Self::all_reduce) on the group's thread; the buffer
    /// comes back from [`Work::wait`].
    ///
    /// ```
    /// # use prism_collective::{GroupOptions, ProcessGroup, ReduceOp};
    /// # let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let first = group.all_reduce_async(vec![1.0f32; 1024], ReduceOp::Sum);
    /// let second = group.all_reduce_async(vec![2.0f32; 1024], ReduceOp::Sum);
    /// // ... backward pass of the next layer here ...
    /// let (first, second) = (first.wait()?, second.wait()?);
    /// # assert_eq!((first[0], second[0]), (1.0, 2.0));
    /// # Ok::<(), prism_collective::CollectiveError>(())
    /// ```
    pub fn all_reduce_async<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        self.submit(move |shared| shared.all_reduce(&mut buf, op).map(|()| buf))
    }

    /// [`reduce_scatter`](Self::reduce_scatter) on the group's thread.
    pub fn reduce_scatter_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Work<(Vec<T>, Range<usize>)> {
        self.submit(move |shared| shared.reduce_scatter(&mut buf, op).map(|r| (buf, r)))
    }

    /// [`all_gather`](Self::all_gather) on the group's thread; returns the
    /// gathered buffer.
    pub fn all_gather_async<T: Element>(&self, input: Vec<T>) -> Work<Vec<T>> {
        self.submit(move |shared| {
            let mut output = Vec::with_capacity(input.len() * shared.world_size);
            output.resize(
                input.len() * shared.world_size,
                input.first().copied().unwrap_or_else(|| T::from_f64(0.0)),
            );
            shared.all_gather(&input, &mut output).map(|()| output)
        })
    }

    /// [`broadcast`](Self::broadcast) on the group's thread.
    pub fn broadcast_async<T: Element>(&self, mut buf: Vec<T>, root: usize) -> Work<Vec<T>> {
        self.submit(move |shared| shared.broadcast(&mut buf, root).map(|()| buf))
    }

    /// [`barrier`](Self::barrier) on the group's thread.
    pub fn barrier_async(&self) -> Work<()> {
        self.submit(|shared| shared.barrier())
    }

    fn submit<R: Send + 'static>(
        &self,
        job: impl FnOnce(&Shared) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let (tx, rx) = mpsc::sync_channel(1);
        *lock(&self.shared.pending) += 1;
        let guard = PendingGuard(self.shared.clone());
        let boxed: Job = Box::new(move || {
            let result = job(&guard.0);
            let _ = tx.send(result);
            drop(guard);
        });
        if let Some(jobs) = &self.jobs {
            // A send error drops the job (and its guard and sender), which
            // makes the Work report WorkerGone.
            let _ = jobs.send(boxed);
        }
        Work { rx, result: None }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(worker) = self.worker.take() {
            // Queued calls are bounded by their timeouts, so this ends.
            let _ = worker.join();
        }
    }
}

/// A non-blocking collective in flight. Dropping it does not cancel the call
/// (every rank must still make it); the result is discarded.
pub struct Work<R> {
    rx: mpsc::Receiver<Result<R>>,
    result: Option<Result<R>>,
}

impl<R> fmt::Debug for Work<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("complete", &self.result.is_some())
            .finish()
    }
}

impl<R> Work<R> {
    /// Whether the call has finished (successfully or not).
    pub fn is_complete(&mut self) -> bool {
        if self.result.is_none() {
            match self.rx.try_recv() {
                Ok(r) => self.result = Some(r),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.result = Some(Err(CollectiveError::WorkerGone))
                }
            }
        }
        self.result.is_some()
    }

    /// Waits for the call and returns its result. Bounded: the call itself
    /// is bounded by the group's timeout, as is every call queued before it.
    pub fn wait(self) -> Result<R> {
        match self.result {
            Some(r) => r,
            None => self.rx.recv().unwrap_or(Err(CollectiveError::WorkerGone)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ProcessGroup>();
        fn assert_send<T: Send>() {}
        assert_send::<Work<Vec<f32>>>();
    }

    #[test]
    fn bad_options_are_refused_before_any_network_activity() {
        let err =
            ProcessGroup::join(GroupOptions::new(3, 3, "127.0.0.1:1")).expect_err("rank 3 of 3");
        assert!(matches!(
            err,
            CollectiveError::InvalidRank {
                rank: 3,
                world_size: 3
            }
        ));
        let err =
            ProcessGroup::join(GroupOptions::new(0, 2, "127.0.0.1:1").group_name("two words"))
                .expect_err("a name with a space");
        assert!(matches!(err, CollectiveError::InvalidGroupName { .. }));
    }

    #[test]
    fn a_group_of_one_checks_its_arguments_and_copies() {
        let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))
            .expect("a group of one needs no peers");
        let mut out = vec![0i64; 3];
        group.all_gather(&[1, 2, 3], &mut out).expect("same length");
        assert_eq!(out, [1, 2, 3]);
        assert!(matches!(
            group.all_gather(&[1i64], &mut out),
            Err(CollectiveError::BufferLength { .. })
        ));
        assert!(matches!(
            group.broadcast(&mut out, 1),
            Err(CollectiveError::InvalidRoot { .. })
        ));
        assert_eq!(
            group
                .reduce_scatter(&mut out, ReduceOp::Sum)
                .expect("no-op"),
            0..3
        );
    }
}
