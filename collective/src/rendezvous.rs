//! How the ranks of a group find each other.
//!
//! Before any collective, every rank must learn where every other rank
//! listens. [`Rendezvous`] is that one step: publish your own [`PeerRecord`],
//! get back everyone's, in rank order. [`TcpRendezvous`] does it the way
//! torch.distributed's `env://` does: rank 0 listens on the master address,
//! the others connect to it. Forming groups through the cluster's control
//! store instead is a second implementation of the same trait, passed to
//! [`ProcessGroup::join_with`](crate::ProcessGroup::join_with).
//!
//! # Addresses
//!
//! A rank listens for its peers on every interface at an ephemeral port and
//! publishes the port with an unspecified IP; the rendezvous fills in the IP
//! it saw the rank come from, so no rank has to guess its own address.

use super::error::{CollectiveError, Result};
use prism_config::Backoff;
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one rank publishes at rendezvous.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRecord {
    /// The rank.
    pub rank: usize,
    /// Where the rank accepts connections from its peers.
    pub data_addr: SocketAddr,
    /// Identifies the host, kernel boot and namespaces; ranks with equal ids
    /// can share memory.
    pub host_id: String,
    /// The rank's process id (meaningful to ranks with the same `host_id`).
    pub pid: u32,
    /// A random number; rank 0's becomes the group's identity, so that
    /// connections from another group are refused.
    pub nonce: u64,
}

/// One step that turns every rank's [`PeerRecord`] into the full table.
///
/// Implementations must return the records sorted by rank, one per rank, or
/// an error by `deadline`. A record's `data_addr` arrives with an
/// unspecified IP; the implementation replaces it with an address the other
/// ranks can reach (as [`TcpRendezvous`] does with the address it saw, and
/// [`KvRendezvous`] with the one it was given).
pub trait Rendezvous: Send + Sync + fmt::Debug {
    /// Publishes `me` for the group `group_name` of `world_size` ranks and
    /// returns every rank's record.
    fn exchange(
        &self,
        group_name: &str,
        world_size: usize,
        me: PeerRecord,
        deadline: Instant,
    ) -> Result<Vec<PeerRecord>>;
}

/// `env://`-style rendezvous: rank 0 listens on the master address and hands
/// every rank the table once all have connected.
///
/// ```
/// use prism_collective::TcpRendezvous;
/// let rdv = TcpRendezvous::new("127.0.0.1:29500");
/// assert_eq!(rdv.master(), "127.0.0.1:29500");
/// ```
#[derive(Clone, Debug)]
pub struct TcpRendezvous {
    master: String,
    /// For rank 0: a listener the caller bound already (see
    /// [`TcpRendezvous::on_listener`]).
    listener: Option<Arc<TcpListener>>,
}

const HELLO: &str = "PRISM-RDV1";

impl TcpRendezvous {
    /// A rendezvous at `master` (`host:port`).
    pub fn new(master: impl Into<String>) -> Self {
        TcpRendezvous {
            master: master.into(),
            listener: None,
        }
    }

    /// A rendezvous whose rank 0 serves on `listener`, bound by the caller.
    ///
    /// Binding port 0 and handing the listener here lets the system pick a
    /// free master port with no window in which another process could take
    /// it (binding, closing and binding again has one). The other ranks
    /// meet at [`TcpRendezvous::master`] with [`TcpRendezvous::new`].
    ///
    /// ```
    /// use prism_collective::{GroupOptions, ProcessGroup, TcpRendezvous};
    /// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let rdv = TcpRendezvous::on_listener(listener)?;
    /// let master = rdv.master().to_string();
    /// let group = ProcessGroup::join_with(GroupOptions::new(0, 1, master), &rdv)?;
    /// assert_eq!(group.world_size(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_listener(listener: TcpListener) -> Result<Self> {
        let addr = listener.local_addr().map_err(|e| {
            CollectiveError::io(None, "reading the rendezvous listener's address", e)
        })?;
        Ok(TcpRendezvous {
            master: addr.to_string(),
            listener: Some(Arc::new(listener)),
        })
    }

    /// The rendezvous at `MASTER_ADDR:MASTER_PORT`.
    pub fn from_env() -> Result<Self> {
        let addr = std::env::var("MASTER_ADDR").map_err(|_| CollectiveError::MissingEnv {
            name: "MASTER_ADDR",
        })?;
        let port = std::env::var("MASTER_PORT").map_err(|_| CollectiveError::MissingEnv {
            name: "MASTER_PORT",
        })?;
        let port: u16 = port.parse().map_err(|_| CollectiveError::InvalidConfig {
            key: "MASTER_PORT".into(),
            value: port,
            expected: "a port number".into(),
        })?;
        Ok(TcpRendezvous::new(format!("{addr}:{port}")))
    }

    /// The master address.
    pub fn master(&self) -> &str {
        &self.master
    }

    fn resolve(&self) -> Result<SocketAddr> {
        self.master
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| CollectiveError::BadAddress {
                address: self.master.clone(),
            })
    }

    fn timeout_error(
        &self,
        world_size: usize,
        joined: usize,
        deadline: Instant,
        start: Instant,
    ) -> CollectiveError {
        CollectiveError::RendezvousTimeout {
            master: self.master.clone(),
            joined,
            world_size,
            timeout: deadline.saturating_duration_since(start),
        }
    }

    fn serve(
        &self,
        group_name: &str,
        world_size: usize,
        me: PeerRecord,
        deadline: Instant,
    ) -> Result<Vec<PeerRecord>> {
        let start = Instant::now();
        let master = self.resolve()?;
        let any = match master.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        };
        let bound;
        let listener = match &self.listener {
            Some(listener) => listener.as_ref(),
            None => {
                bound = TcpListener::bind((any, master.port())).map_err(|e| {
                    CollectiveError::io(None, "binding the rendezvous master port", e)
                })?;
                &bound
            }
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| CollectiveError::io(None, "configuring the rendezvous listener", e))?;
        let mut records: Vec<Option<PeerRecord>> = vec![None; world_size];
        let mut streams: Vec<TcpStream> = Vec::with_capacity(world_size);
        let mut me = me;
        if me.data_addr.ip().is_unspecified() {
            me.data_addr.set_ip(master.ip());
        }
        records[0] = Some(me);
        let mut joined = 1;
        while joined < world_size {
            let now = Instant::now();
            if now >= deadline {
                // Tell the ranks already here, so they fail with the same
                // diagnosis instead of a closed connection.
                let msg = format!("ERR timeout {joined}\n");
                for s in &streams {
                    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
                    let _ = (&*s).write_all(msg.as_bytes());
                }
                return Err(self.timeout_error(world_size, joined, deadline, start));
            }
            let (stream, from) = match listener.accept() {
                Ok(pair) => pair,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2).min(deadline - now));
                    continue;
                }
                Err(e) => {
                    return Err(CollectiveError::io(
                        None,
                        "accepting a rendezvous connection",
                        e,
                    ))
                }
            };
            let Some(mut record) = self.read_join(&stream, group_name, world_size, deadline)?
            else {
                continue; // Not our protocol: ignore the stray connection.
            };
            if record.data_addr.ip().is_unspecified() {
                record.data_addr.set_ip(from.ip());
            }
            let rank = record.rank;
            if rank == 0 || records[rank].is_some() {
                let _ = (&stream).write_all(b"ERR duplicate\n");
                return Err(CollectiveError::DuplicateRank {
                    master: self.master.clone(),
                    rank,
                });
            }
            records[rank] = Some(record);
            streams.push(stream);
            joined += 1;
        }
        let table: Vec<PeerRecord> = records.into_iter().flatten().collect();
        let mut reply = format!("OK {}\n", table.len());
        for r in &table {
            reply.push_str(&format!(
                "{} {} {} {} {}\n",
                r.rank, r.data_addr, r.host_id, r.pid, r.nonce
            ));
        }
        for mut s in streams {
            s.set_nonblocking(false)
                .and_then(|_| s.set_write_timeout(Some(remaining(deadline))))
                .and_then(|_| s.write_all(reply.as_bytes()))
                .map_err(|e| CollectiveError::io(None, "sending the rendezvous table", e))?;
        }
        Ok(table)
    }

    /// Reads one join line; `None` for a connection that does not speak the
    /// protocol.
    fn read_join(
        &self,
        stream: &TcpStream,
        group_name: &str,
        world_size: usize,
        deadline: Instant,
    ) -> Result<Option<PeerRecord>> {
        let setup = stream.set_nonblocking(false).and_then(|_| {
            stream.set_read_timeout(Some(remaining(deadline).min(Duration::from_secs(5))))
        });
        if setup.is_err() {
            return Ok(None);
        }
        let mut line = String::new();
        if BufReader::new(stream).take_line(&mut line).is_err() {
            return Ok(None);
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 8 || f[0] != HELLO {
            return Ok(None);
        }
        let mismatch = |field: &'static str, ours: String, theirs: &str, rank: usize| {
            let code = field.split(' ').next().unwrap_or(field);
            let _ = (&*stream).write_all(format!("ERR mismatch {code} {ours}\n").as_bytes());
            CollectiveError::RendezvousMismatch {
                master: self.master.clone(),
                rank,
                field,
                ours,
                theirs: theirs.to_string(),
            }
        };
        let rank: usize = match f[3].parse() {
            Ok(r) => r,
            Err(_) => return Ok(None),
        };
        if f[1] != group_name {
            return Err(mismatch("group name", group_name.to_string(), f[1], rank));
        }
        if f[2] != world_size.to_string() {
            return Err(mismatch("world size", world_size.to_string(), f[2], rank));
        }
        if rank >= world_size {
            return Err(mismatch("rank", format!("0..{world_size}"), f[3], rank));
        }
        let parsed = (
            f[4].parse::<u16>(),
            f[6].parse::<u32>(),
            f[7].parse::<u64>(),
        );
        let (Ok(port), Ok(pid), Ok(nonce)) = parsed else {
            return Ok(None);
        };
        Ok(Some(PeerRecord {
            rank,
            data_addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
            host_id: f[5].to_string(),
            pid,
            nonce,
        }))
    }

    fn join(
        &self,
        group_name: &str,
        world_size: usize,
        me: PeerRecord,
        deadline: Instant,
    ) -> Result<Vec<PeerRecord>> {
        let start = Instant::now();
        let master = self.resolve()?;
        let mut backoff =
            Backoff::new(Duration::from_millis(10), Duration::from_millis(200)).until(deadline);
        let stream = loop {
            let left = backoff.remaining();
            if left.is_zero() {
                return Err(self.timeout_error(world_size, 1, deadline, start));
            }
            match TcpStream::connect_timeout(&master, left.min(Duration::from_secs(2))) {
                Ok(s) => break s,
                Err(_) => {
                    // The master may not be listening yet: retry, bounded by
                    // the deadline.
                    backoff.sleep();
                }
            }
        };
        let line = format!(
            "{HELLO} {group_name} {world_size} {} {} {} {} {}\n",
            me.rank,
            me.data_addr.port(),
            me.host_id,
            me.pid,
            me.nonce
        );
        (&stream)
            .write_all(line.as_bytes())
            .map_err(|e| CollectiveError::io(Some(0), "sending the rendezvous join", e))?;
        let mut reader = BufReader::new(&stream);
        let mut head = String::new();
        let read_line = |reader: &mut BufReader<&TcpStream>, buf: &mut String| -> Result<()> {
            let left = remaining(deadline);
            if left.is_zero() {
                return Err(self.timeout_error(world_size, 1, deadline, start));
            }
            stream.set_read_timeout(Some(left)).map_err(|e| {
                CollectiveError::io(Some(0), "configuring the rendezvous socket", e)
            })?;
            match reader.take_line(buf) {
                Ok(0) => Err(CollectiveError::PeerDisconnected { peer: 0 }),
                Ok(_) => Ok(()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    Err(self.timeout_error(world_size, 1, deadline, start))
                }
                Err(e) => Err(CollectiveError::io(
                    Some(0),
                    "reading the rendezvous table",
                    e,
                )),
            }
        };
        read_line(&mut reader, &mut head)?;
        let f: Vec<&str> = head.split_whitespace().collect();
        match f.as_slice() {
            ["OK", n] if n.parse::<usize>().ok() == Some(world_size) => {}
            ["ERR", "timeout", joined] => {
                return Err(self.timeout_error(
                    world_size,
                    joined.parse().unwrap_or(1),
                    deadline,
                    start,
                ));
            }
            ["ERR", "duplicate"] => {
                return Err(CollectiveError::DuplicateRank {
                    master: self.master.clone(),
                    rank: me.rank,
                })
            }
            ["ERR", "mismatch", field, ours @ ..] => {
                let field = match *field {
                    "group" => "group name",
                    "world" => "world size",
                    _ => "rank",
                };
                return Err(CollectiveError::RendezvousMismatch {
                    master: self.master.clone(),
                    rank: me.rank,
                    field,
                    ours: ours.last().unwrap_or(&"?").to_string(),
                    theirs: String::new(),
                });
            }
            _ => {
                return Err(CollectiveError::Protocol {
                    peer: 0,
                    detail: "bad rendezvous reply",
                })
            }
        }
        let mut table = Vec::with_capacity(world_size);
        for expected_rank in 0..world_size {
            let mut line = String::new();
            read_line(&mut reader, &mut line)?;
            let record = parse_record(&line)
                .filter(|r| r.rank == expected_rank)
                .ok_or(CollectiveError::Protocol {
                    peer: 0,
                    detail: "bad rendezvous table row",
                })?;
            table.push(record);
        }
        Ok(table)
    }
}

impl Rendezvous for TcpRendezvous {
    fn exchange(
        &self,
        group_name: &str,
        world_size: usize,
        me: PeerRecord,
        deadline: Instant,
    ) -> Result<Vec<PeerRecord>> {
        if me.rank == 0 {
            self.serve(group_name, world_size, me, deadline)
        } else {
            self.join(group_name, world_size, me, deadline)
        }
    }
}

/// A key-value store that every rank can reach, such as the cluster's
/// control store: the only thing a store-backed rendezvous needs.
pub trait KvStore: Send + Sync + fmt::Debug {
    /// Stores `value` under `key`, replacing any earlier value.
    fn put(&self, key: &str, value: &str) -> Result<()>;
    /// The value under `key`, if any.
    fn get(&self, key: &str) -> Result<Option<String>>;
}

/// Rendezvous through a [`KvStore`]: each rank puts its record under
/// `prism/collective/<group>/<rank>` and polls for the others'.
///
/// Keys are not deleted, so give every run its own group name (a job id in
/// it), or a rank may meet the records of a finished run.
///
/// ```
/// use prism_collective::{GroupOptions, KvRendezvous, KvStore, ProcessGroup};
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// #[derive(Debug, Default)]
/// struct Memory(Mutex<HashMap<String, String>>);
///
/// impl KvStore for Memory {
///     fn put(&self, key: &str, value: &str) -> prism_collective::Result<()> {
///         self.0.lock().unwrap().insert(key.into(), value.into());
///         Ok(())
///     }
///     fn get(&self, key: &str) -> prism_collective::Result<Option<String>> {
///         Ok(self.0.lock().unwrap().get(key).cloned())
///     }
/// }
///
/// let rendezvous = KvRendezvous::new(Memory::default(), "127.0.0.1".parse().unwrap());
/// let group = ProcessGroup::join_with(GroupOptions::new(0, 1, "unused:0"), &rendezvous)?;
/// assert_eq!(group.world_size(), 1);
/// # Ok::<(), prism_collective::CollectiveError>(())
/// ```
#[derive(Debug)]
pub struct KvRendezvous<S> {
    store: S,
    advertise: IpAddr,
}

impl<S: KvStore> KvRendezvous<S> {
    /// Rendezvous through `store`; this rank tells the others to reach it at
    /// `advertise`.
    pub fn new(store: S, advertise: IpAddr) -> Self {
        KvRendezvous { store, advertise }
    }
}

impl<S: KvStore> Rendezvous for KvRendezvous<S> {
    fn exchange(
        &self,
        group_name: &str,
        world_size: usize,
        me: PeerRecord,
        deadline: Instant,
    ) -> Result<Vec<PeerRecord>> {
        let start = Instant::now();
        let key = |rank: usize| format!("prism/collective/{group_name}/{rank}");
        let mut me = me;
        if me.data_addr.ip().is_unspecified() {
            me.data_addr.set_ip(self.advertise);
        }
        let row = format!(
            "{} {} {} {} {}",
            me.rank, me.data_addr, me.host_id, me.pid, me.nonce
        );
        self.store.put(&key(me.rank), &row)?;
        let mut table: Vec<Option<PeerRecord>> = vec![None; world_size];
        let mut backoff =
            Backoff::new(Duration::from_millis(1), Duration::from_millis(50)).until(deadline);
        // Bounded by the deadline.
        loop {
            for (rank, slot) in table.iter_mut().enumerate().filter(|(_, s)| s.is_none()) {
                if let Some(value) = self.store.get(&key(rank))? {
                    let record = parse_record(&value).filter(|r| r.rank == rank).ok_or(
                        CollectiveError::Protocol {
                            peer: rank,
                            detail: "malformed rendezvous record in the store",
                        },
                    )?;
                    *slot = Some(record);
                }
            }
            let joined = table.iter().filter(|s| s.is_some()).count();
            if joined == world_size {
                return Ok(table.into_iter().flatten().collect());
            }
            if Instant::now() >= deadline {
                return Err(CollectiveError::RendezvousTimeout {
                    master: format!("key-value store, group {group_name}"),
                    joined,
                    world_size,
                    timeout: deadline.saturating_duration_since(start),
                });
            }
            backoff.sleep();
        }
    }
}

fn parse_record(line: &str) -> Option<PeerRecord> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 5 {
        return None;
    }
    Some(PeerRecord {
        rank: f[0].parse().ok()?,
        data_addr: f[1].parse().ok()?,
        host_id: f[2].to_string(),
        pid: f[3].parse().ok()?,
        nonce: f[4].parse().ok()?,
    })
}

pub(crate) fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// `read_line` capped at 4 KiB, so a stray peer cannot make us buffer
/// without bound.
trait TakeLine {
    fn take_line(&mut self, buf: &mut String) -> std::io::Result<usize>;
}

impl<R: std::io::Read> TakeLine for BufReader<R> {
    fn take_line(&mut self, buf: &mut String) -> std::io::Result<usize> {
        use std::io::Read;
        let mut bytes = Vec::new();
        let n = self.by_ref().take(4096).read_until(b'\n', &mut bytes)?;
        buf.push_str(&String::from_utf8_lossy(&bytes));
        Ok(n)
    }
}

/// Identifies this host, kernel boot and the namespaces that decide whether
/// two processes can share memory and signal each other.
pub(crate) fn local_host_id() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "noboot".to_string());
    let ns = |name: &str| {
        std::fs::read_link(format!("/proc/self/ns/{name}"))
            .ok()
            .and_then(|p| {
                let s = p.to_string_lossy().to_string();
                s.split('[')
                    .nth(1)
                    .map(|t| t.trim_end_matches(']').to_string())
            })
            .unwrap_or_else(|| "0".to_string())
    };
    format!("{boot}:{}:{}:{}", ns("pid"), ns("ipc"), ns("mnt"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_row_round_trips() {
        let r =
            parse_record("3 10.0.0.7:4100 abc:1:2:3 77 99\n").expect("a well-formed row parses");
        assert_eq!(r.rank, 3);
        assert_eq!(
            r.data_addr,
            "10.0.0.7:4100".parse().expect("literal address")
        );
        assert_eq!(r.pid, 77);
        assert!(parse_record("3 nonsense").is_none());
    }

    #[test]
    fn the_host_id_has_no_spaces() {
        let id = local_host_id();
        assert!(!id.contains(char::is_whitespace), "{id}");
    }
}
