//! Shared memory with the ranks on this host, TCP with the others.
//!
//! When a group spans hosts and some of its ranks share one, the ranks of
//! each host form a [`ShmMesh`] among themselves and reach everyone else over
//! a [`TcpMesh`]. The engine sees one mesh: `link` picks the transport per
//! peer, and `wait` watches both: first polling rings and sockets without
//! sleeping (yielding the CPU between polls) for `shm_spin_us`, then
//! sleeping on the sockets in slices of 50 us with a look at the rings
//! between slices.

use super::shm::ShmMesh;
use super::tcp::TcpMesh;
use super::{Interest, Link, Mesh};
use crate::error::Result;
use crate::rendezvous::remaining;
use std::time::{Duration, Instant};

/// How long one socket poll may keep a rank from noticing shared-memory
/// progress.
const SOCKET_SLICE: Duration = Duration::from_micros(50);

pub(crate) struct HybridMesh {
    shm: ShmMesh,
    tcp: TcpMesh,
    /// How long to poll both sides before sleeping on the sockets.
    spin: Duration,
    /// Whether each rank is reached through shared memory.
    local: Vec<bool>,
    local_interest: Vec<Interest>,
    remote_interest: Vec<Interest>,
}

impl HybridMesh {
    pub(crate) fn new(shm: ShmMesh, tcp: TcpMesh, local: Vec<bool>, spin: Duration) -> HybridMesh {
        HybridMesh {
            shm,
            tcp,
            spin,
            local,
            local_interest: Vec::new(),
            remote_interest: Vec::new(),
        }
    }
}

impl Mesh for HybridMesh {
    fn link(&mut self, peer: usize) -> &mut dyn Link {
        if self.local[peer] {
            self.shm.link(peer)
        } else {
            self.tcp.link(peer)
        }
    }

    fn wait(&mut self, interest: &[Interest], deadline: Instant) -> Result<()> {
        self.local_interest.clear();
        self.remote_interest.clear();
        for i in interest {
            if self.local[i.peer] {
                self.local_interest.push(*i);
            } else {
                self.remote_interest.push(*i);
            }
        }
        if self.remote_interest.is_empty() {
            return self.shm.wait(&self.local_interest, deadline);
        }
        if self.local_interest.is_empty() {
            return self.tcp.wait(&self.remote_interest, deadline);
        }
        let until = Instant::now() + self.spin;
        for polls in 0u32.. {
            if self.shm.ready(&self.local_interest)
                || self.tcp.wait_up_to(&self.remote_interest, Duration::ZERO)?
            {
                return Ok(());
            }
            if polls % 8 == 7 && Instant::now() >= until {
                break;
            }
            std::thread::yield_now();
        }
        self.shm.check_group(&self.local_interest)?;
        let slice = remaining(deadline).min(SOCKET_SLICE);
        self.tcp.wait_up_to(&self.remote_interest, slice)?;
        Ok(())
    }

    fn set_bulk(&mut self, bulk: bool) {
        self.shm.set_bulk(bulk);
    }

    fn abort(&mut self) {
        self.shm.abort();
        self.tcp.abort();
    }

    fn name(&self) -> &'static str {
        "shm+tcp"
    }
}
