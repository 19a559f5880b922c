//! TCP links: one socket per pair of ranks, non-blocking, driven by `poll`.
//!
//! # Connecting
//!
//! Every rank listens before the rendezvous. Afterwards rank `i` connects to
//! every rank below it and accepts from every rank above it, and each side
//! sends a 16-byte hello (magic, rank, group nonce). A connection whose hello
//! names another group or an impossible rank is dropped and the accept goes
//! on, so two groups sharing hosts never cross. A group given
//! [`GroupTls`] runs TLS on its links between hosts, from before the hello
//! on (see [`super::tls`]).
//!
//! # Reading
//!
//! Copies read straight into the destination. Reductions read into a staging
//! area of one chunk and combine whole elements from it; a partial element
//! waits at the front of the staging area for the rest of its bytes.

use super::tls::{self, GroupTls};
use super::{Interest, Link, Mesh};
use crate::config::CollectiveConfig;
use crate::error::{CollectiveError, Result};
use crate::rendezvous::{remaining, PeerRecord};
use prism_config::Backoff;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

const HELLO_MAGIC: u32 = 0x4d53_5250; // "PRSM" little-endian

/// The listener a rank opens before rendezvous.
pub(crate) fn bind_data_listener() -> Result<TcpListener> {
    let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
        .map_err(|e| CollectiveError::io(None, "binding the peer listener", e))?;
    l.set_nonblocking(true)
        .map_err(|e| CollectiveError::io(None, "configuring the peer listener", e))?;
    Ok(l)
}

fn hello(rank: usize, nonce: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&(rank as u32).to_le_bytes());
    h[8..16].copy_from_slice(&nonce.to_le_bytes());
    h
}

/// Parses a hello; `Some(rank)` when it belongs to this group.
fn parse_hello(h: &[u8; 16], nonce: u64, world_size: usize) -> Option<usize> {
    let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let rank = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
    let theirs = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
    (magic == HELLO_MAGIC && theirs == nonce && rank < world_size).then_some(rank)
}

fn read_exact_by(stream: &TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let left = remaining(deadline);
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    stream.set_read_timeout(Some(left))?;
    (&*stream).read_exact(buf)
}

/// Opens one connection to every other rank; the result is indexed by rank
/// (`None` at this rank's own index).
/// One rank's socket to a peer, with its TLS when the link is encrypted.
pub(crate) struct PeerStream {
    pub(crate) tcp: TcpStream,
    pub(crate) tls: Option<rustls::Connection>,
}

impl PeerStream {
    fn send_hello(&mut self, peer: usize, rank: usize, nonce: u64) -> Result<()> {
        let h = hello(rank, nonce);
        match &mut self.tls {
            Some(conn) => tls::write_all(conn, &self.tcp, &h),
            None => (&self.tcp).write_all(&h),
        }
        .map_err(|e| CollectiveError::io(Some(peer), "greeting a peer", e))
    }

    fn read_hello(&mut self, deadline: Instant) -> std::io::Result<[u8; 16]> {
        let mut h = [0u8; 16];
        match &mut self.tls {
            Some(conn) => tls::read_exact(conn, &self.tcp, &mut h, deadline)?,
            None => read_exact_by(&self.tcp, &mut h, deadline)?,
        }
        Ok(h)
    }
}

/// The first byte of a TLS record that opens a handshake.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Opens one connection to every other rank; the result is indexed by rank
/// (`None` at this rank's own index). With `tls`, links to ranks on other
/// hosts are encrypted (the connecting rank starts TLS before its hello).
pub(crate) fn connect_mesh(
    rank: usize,
    table: &[PeerRecord],
    listener: TcpListener,
    tls: Option<&GroupTls>,
    deadline: Instant,
) -> Result<Vec<Option<PeerStream>>> {
    let n = table.len();
    let nonce = table[0].nonce;
    let encrypted = |peer: usize| tls.is_some() && table[peer].host_id != table[rank].host_id;
    let mut streams: Vec<Option<PeerStream>> = (0..n).map(|_| None).collect();
    let timed_out = |peer| {
        CollectiveError::io(
            Some(peer),
            "connecting to a peer",
            std::io::ErrorKind::TimedOut.into(),
        )
    };
    // Connect downwards; every listener exists already, so these complete
    // without the peer's help.
    for (peer, record) in table.iter().enumerate().take(rank) {
        let mut backoff =
            Backoff::new(Duration::from_millis(5), Duration::from_millis(100)).until(deadline);
        let stream = loop {
            let left = backoff.remaining();
            if left.is_zero() {
                return Err(timed_out(peer));
            }
            match TcpStream::connect_timeout(&record.data_addr, left.min(Duration::from_secs(2))) {
                Ok(s) => break s,
                Err(_) => {
                    backoff.sleep();
                }
            }
        };
        let conn = match tls {
            Some(tls) if encrypted(peer) => {
                Some(tls.connect(&stream, record.data_addr.ip(), peer, deadline)?)
            }
            _ => None,
        };
        let mut stream = PeerStream {
            tcp: stream,
            tls: conn,
        };
        stream.send_hello(peer, rank, nonce)?;
        streams[peer] = Some(stream);
    }
    // Accept upwards, skipping strangers.
    let mut accepted = 0;
    while accepted < n - 1 - rank {
        let left = remaining(deadline);
        if left.is_zero() {
            let missing = (rank + 1..n)
                .find(|p| streams[*p].is_none())
                .unwrap_or(rank);
            return Err(timed_out(missing));
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1).min(left));
                continue;
            }
            Err(e) => return Err(CollectiveError::io(None, "accepting a peer", e)),
        };
        if stream.set_nonblocking(false).is_err() {
            continue;
        }
        let hello_deadline = deadline.min(Instant::now() + Duration::from_secs(5));
        // A peer in TLS opens with a handshake record, a plain one with
        // its hello.
        let mut first = [0u8; 1];
        let peeked = stream
            .set_read_timeout(Some(
                remaining(hello_deadline).max(Duration::from_millis(1)),
            ))
            .and_then(|_| stream.peek(&mut first));
        if !matches!(peeked, Ok(1)) {
            continue;
        }
        let conn = match tls {
            Some(tls) if first[0] == TLS_HANDSHAKE_RECORD => {
                match tls.accept(&stream, hello_deadline) {
                    Ok(conn) => Some(conn),
                    Err(e) => {
                        // The connecting rank learns why from its own side.
                        tracing::warn!(error = %e, "refused a collective link");
                        continue;
                    }
                }
            }
            _ => None,
        };
        let mut stream = PeerStream {
            tcp: stream,
            tls: conn,
        };
        let Ok(h) = stream.read_hello(hello_deadline) else {
            continue;
        };
        match parse_hello(&h, nonce, n) {
            Some(peer) if peer > rank && streams[peer].is_none() => {
                if stream.tls.is_some() != encrypted(peer) {
                    return Err(CollectiveError::Tls {
                        peer: Some(peer),
                        detail: format!(
                            "rank {peer} connected {} TLS, and this rank {} it for that \
                             link; every rank of a group must be given the same GroupTls",
                            if stream.tls.is_some() {
                                "with"
                            } else {
                                "without"
                            },
                            if encrypted(peer) {
                                "requires"
                            } else {
                                "does not expect"
                            },
                        ),
                    });
                }
                stream.send_hello(peer, rank, nonce)?;
                streams[peer] = Some(stream);
                accepted += 1;
            }
            _ => continue,
        }
    }
    // Collect the answers to our own hellos.
    for (peer, slot) in streams.iter_mut().enumerate().take(rank) {
        let Some(stream) = slot else { continue };
        let h = stream
            .read_hello(deadline)
            .map_err(|e| CollectiveError::io(Some(peer), "waiting for a peer's greeting", e))?;
        if parse_hello(&h, nonce, n) != Some(peer) {
            return Err(CollectiveError::Protocol {
                peer,
                detail: "greeting from another group",
            });
        }
    }
    Ok(streams)
}

fn set_buffer(fd: RawFd, option: libc::c_int, bytes: usize) {
    let value = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: plain setsockopt on an open socket with a correctly sized int.
    // A refusal only costs throughput, so the result is ignored.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

pub(crate) struct TcpLink {
    peer: usize,
    stream: TcpStream,
    /// The link's TLS, when it is encrypted.
    tls: Option<rustls::Connection>,
    /// Staging for reductions, as u64 so element reads are aligned.
    staging: Vec<u64>,
    filled: usize,
}

fn as_bytes(words: &mut [u64]) -> &mut [u8] {
    let len = words.len() * 8;
    // SAFETY: reinterpreting owned u64 storage as bytes.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, len) }
}

/// Reads into `dst` without blocking: 0 when nothing is there yet.
fn recv(
    peer: usize,
    stream: &TcpStream,
    tls: &mut Option<rustls::Connection>,
    dst: &mut [u8],
) -> Result<usize> {
    if let Some(conn) = tls {
        return moved(
            peer,
            "reading from a peer over TLS",
            tls::try_read(conn, stream, dst),
        );
    }
    // SAFETY: `dst` is writable memory of `dst.len()` bytes.
    let r = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            dst.as_mut_ptr() as *mut libc::c_void,
            dst.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if r > 0 {
        return Ok(r as usize);
    }
    if r == 0 {
        return Err(CollectiveError::PeerDisconnected { peer });
    }
    nothing_moved(peer, "reading from a peer")
}

/// What a TLS read or write that moved `outcome` means for the engine.
fn moved(
    peer: usize,
    context: &'static str,
    outcome: std::io::Result<tls::Moved>,
) -> Result<usize> {
    match outcome {
        Ok(tls::Moved::Bytes(n)) => Ok(n),
        Ok(tls::Moved::Nothing) => Ok(0),
        Ok(tls::Moved::Closed) => Err(CollectiveError::PeerDisconnected { peer }),
        Err(e) => match e.kind() {
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => {
                Err(CollectiveError::PeerDisconnected { peer })
            }
            _ => Err(CollectiveError::io(Some(peer), context, e)),
        },
    }
}

impl Link for TcpLink {
    fn try_write(&mut self, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        if let Some(conn) = &mut self.tls {
            let outcome = tls::try_write(conn, &self.stream, data);
            return moved(self.peer, "writing to a peer over TLS", outcome);
        }
        // MSG_NOSIGNAL: a dead peer must give an error, not SIGPIPE.
        // SAFETY: `data` is a valid slice.
        let r = unsafe {
            libc::send(
                self.stream.as_raw_fd(),
                data.as_ptr() as *const libc::c_void,
                data.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        nothing_moved(self.peer, "writing to a peer")
    }

    fn try_read_into(&mut self, dst: &mut [u8]) -> Result<usize> {
        debug_assert_eq!(self.filled, 0, "a copy never starts inside a reduction");
        if dst.is_empty() {
            return Ok(0);
        }
        recv(self.peer, &self.stream, &mut self.tls, dst)
    }

    fn try_read_with(
        &mut self,
        max: usize,
        align: usize,
        consume: &mut dyn FnMut(&[u8]),
    ) -> Result<usize> {
        let cap = self.staging.len() * 8;
        let want = max.min(cap);
        if self.filled < want {
            let filled = self.filled;
            let dst = &mut as_bytes(&mut self.staging)[filled..want];
            let got = recv(self.peer, &self.stream, &mut self.tls, dst)?;
            self.filled += got;
        }
        let usable = self.filled - self.filled % align;
        if usable == 0 {
            return Ok(0);
        }
        let filled = self.filled;
        let staging = as_bytes(&mut self.staging);
        consume(&staging[..usable]);
        staging.copy_within(usable..filled, 0);
        self.filled = filled - usable;
        Ok(usable)
    }
}

/// A full mesh of TCP links.
pub(crate) struct TcpMesh {
    links: Vec<Option<TcpLink>>,
    pollfds: Vec<libc::pollfd>,
    /// Per link: TLS holds records not yet sent (TLS links only).
    unsent: Vec<bool>,
}

impl TcpMesh {
    pub(crate) fn new(
        streams: Vec<Option<PeerStream>>,
        config: &CollectiveConfig,
    ) -> Result<TcpMesh> {
        let staging_words = config.chunk_bytes.div_ceil(8);
        let mut links = Vec::with_capacity(streams.len());
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(PeerStream { tcp: stream, tls }) = stream else {
                links.push(None);
                continue;
            };
            stream
                .set_nodelay(true)
                .and_then(|_| stream.set_nonblocking(true))
                .map_err(|e| CollectiveError::io(Some(peer), "configuring a peer socket", e))?;
            if config.tcp_socket_buffer_bytes > 0 {
                let fd = stream.as_raw_fd();
                set_buffer(fd, libc::SO_SNDBUF, config.tcp_socket_buffer_bytes);
                set_buffer(fd, libc::SO_RCVBUF, config.tcp_socket_buffer_bytes);
            }
            links.push(Some(TcpLink {
                peer,
                stream,
                tls,
                staging: vec![0u64; staging_words],
                filled: 0,
            }));
        }
        Ok(TcpMesh {
            unsent: vec![false; links.len()],
            links,
            pollfds: Vec::new(),
        })
    }
}

impl TcpMesh {
    /// Sleeps until a socket in `interest` is ready, or for `timeout`;
    /// returns whether one is. Hang-ups and errors count as ready and show
    /// up as failed reads or writes afterwards.
    pub(crate) fn wait_up_to(&mut self, interest: &[Interest], timeout: Duration) -> Result<bool> {
        self.pollfds.clear();
        // Records that TLS still holds go out whether or not the engine
        // has more to write; decrypted bytes already here need no poll.
        let unsent = &mut self.unsent;
        for (peer, link) in self.links.iter_mut().enumerate() {
            let Some(TcpLink {
                tls: Some(conn),
                stream,
                ..
            }) = link
            else {
                continue;
            };
            let all_sent = match tls::flush(conn, stream) {
                Ok(all) => all,
                Err(e) => {
                    moved(peer, "writing to a peer over TLS", Err(e))?;
                    true
                }
            };
            unsent[peer] = !all_sent;
            let wants_read = interest.iter().any(|i| i.peer == peer && i.read);
            if wants_read && tls::readable(conn) {
                return Ok(true);
            }
        }
        for (peer, pending) in self.unsent.iter().enumerate() {
            if *pending && !interest.iter().any(|i| i.peer == peer) {
                if let Some(link) = self.links[peer].as_ref() {
                    self.pollfds.push(libc::pollfd {
                        fd: link.stream.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    });
                }
            }
        }
        for i in interest {
            let Some(link) = self.links[i.peer].as_ref() else {
                continue;
            };
            let mut events = 0;
            if i.read {
                events |= libc::POLLIN;
            }
            if i.write || self.unsent[i.peer] {
                events |= libc::POLLOUT;
            }
            self.pollfds.push(libc::pollfd {
                fd: link.stream.as_raw_fd(),
                events,
                revents: 0,
            });
        }
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `pollfds` is a valid array of initialised pollfd structs
        // and `ts` a valid timeout; no signal mask is changed.
        let r = unsafe {
            libc::ppoll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if r < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(CollectiveError::io(None, "waiting on peer sockets", err));
            }
        }
        Ok(r > 0)
    }
}

impl Mesh for TcpMesh {
    fn link(&mut self, peer: usize) -> &mut dyn Link {
        match self.links[peer].as_mut() {
            Some(link) => link,
            None => unreachable!("plans never address their own rank"),
        }
    }

    fn wait(&mut self, interest: &[Interest], deadline: Instant) -> Result<()> {
        // Wake at least every 100 ms so the caller re-checks its deadline.
        let slice = remaining(deadline).clamp(Duration::from_millis(1), Duration::from_millis(100));
        self.wait_up_to(interest, slice).map(|_| ())
    }

    fn abort(&mut self) {
        // Write side only: what peers already sent stays readable here, and
        // closing with unread bytes would reset the connection and destroy
        // what this rank sent last (often the header that explains the
        // failure).
        for link in self.links.iter().flatten() {
            let _ = link.stream.shutdown(Shutdown::Write);
        }
    }

    fn name(&self) -> &'static str {
        "tcp"
    }
}

/// What a failed non-blocking `recv`/`send` means: try again later (0
/// bytes), the peer is gone, or another socket error.
fn nothing_moved(peer: usize, context: &'static str) -> Result<usize> {
    let err = std::io::Error::last_os_error();
    match err.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(0),
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => {
            Err(CollectiveError::PeerDisconnected { peer })
        }
        _ => Err(CollectiveError::io(Some(peer), context, err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_from_another_group_is_refused() {
        let h = hello(3, 42);
        assert_eq!(parse_hello(&h, 42, 4), Some(3));
        assert_eq!(
            parse_hello(&h, 43, 4),
            None,
            "another nonce is another group"
        );
        assert_eq!(
            parse_hello(&h, 42, 3),
            None,
            "rank 3 cannot exist in a group of 3"
        );
    }
}
