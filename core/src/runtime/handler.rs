//! Serving what other processes send this one: owner requests go to
//! [`Objects`], executor requests to the [`Executor`], a driver prints the
//! worker output the raylet forwards.

use super::executor::Executor;
use super::objects::Objects;
use super::owned_actors::OwnedActors;
use super::submitter::TaskSubmitter;
use crate::Error;
use parking_lot::Mutex;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::{
    AddBorrower, Address, DriverRequest, OwnerRequest, ReadProgram, Request, Response, Stream,
    PROGRAM_CHUNK,
};
use prism_protocol::program::Program;
use prism_protocol::rpc::{Connection, Handler};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};

/// The components a handler serves, once they exist.
#[derive(Debug)]
struct Bound {
    objects: Weak<Objects>,
    executor: Weak<Executor>,
    tasks: Weak<TaskSubmitter>,
    owned_actors: Weak<OwnedActors>,
    /// A worker's raylet: when that connection closes, the worker exits.
    raylet_peer: Option<String>,
}

/// The components requests are routed to.
pub(crate) struct Components {
    pub(crate) objects: Arc<Objects>,
    pub(crate) executor: Arc<Executor>,
    pub(crate) tasks: Arc<TaskSubmitter>,
    pub(crate) owned_actors: Arc<OwnedActors>,
}

/// Serves requests for a runtime that may not be built yet.
#[derive(Clone, Default)]
pub(crate) struct CoreHandler {
    bound: Arc<OnceLock<Bound>>,
    /// Borrows registered over this connection by the borrower itself:
    /// when the connection closes, that process is gone, and so are they.
    borrows_here: Arc<Mutex<HashMap<Address, Vec<ObjectId>>>>,
}

impl CoreHandler {
    /// Starts serving the runtime's components; `raylet_peer` is set for
    /// a worker, which exits when its raylet goes away.
    pub(crate) fn bind(&self, core: &Components, raylet_peer: Option<String>) {
        let _ = self.bound.set(Bound {
            objects: Arc::downgrade(&core.objects),
            executor: Arc::downgrade(&core.executor),
            tasks: Arc::downgrade(&core.tasks),
            owned_actors: Arc::downgrade(&core.owned_actors),
            raylet_peer,
        });
    }

    /// The handler for one more accepted connection.
    pub(crate) fn for_connection(&self) -> CoreHandler {
        CoreHandler {
            bound: self.bound.clone(),
            borrows_here: Default::default(),
        }
    }
}

impl Handler for CoreHandler {
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
        if let Request::Driver(DriverRequest::WorkerOutput(out)) = &request {
            print_worker_output(&out.label, out.stream, &out.lines);
            return;
        }
        let bound = self.bound.get();
        let objects = bound.and_then(|b| b.objects.upgrade());
        let executor = bound.and_then(|b| b.executor.upgrade());
        let owned_actors = bound.and_then(|b| b.owned_actors.upgrade());
        if let Request::Driver(DriverRequest::ActorEnded(ended)) = &request {
            if let Some(owned_actors) = &owned_actors {
                owned_actors.ended(ended.actor_id);
            }
            return;
        }
        if let Request::Driver(DriverRequest::LeasesWanted(w)) = &request {
            if let Some(tasks) = bound.and_then(|b| b.tasks.upgrade()) {
                tasks.leases_wanted(&w.leases);
            }
            return;
        }
        if let Request::Driver(DriverRequest::ActorRestarted(r)) = &request {
            if let Some(owned_actors) = &owned_actors {
                owned_actors.seen_restarts(r.actor_id, r.num_restarts);
            }
            return;
        }
        if let Request::Driver(DriverRequest::ReadProgram(read)) = &request {
            // Off the connection's reader: a chunk is megabytes of file.
            let (conn, read) = (conn.clone(), read.clone());
            tokio::task::spawn_blocking(move || {
                conn.respond(id, Response::from_result(read_program(&read)))
            });
            return;
        }
        if let Request::Driver(DriverRequest::NodeDied(died)) = &request {
            if let Some(objects) = &objects {
                let n = objects.peers.abandon_node(&died.node_id);
                tracing::warn!(node = %died.node_id, connections = n, "a node died; its connections were given up");
                if let Some(owned_actors) = &owned_actors {
                    owned_actors.node_died(&died.node_id);
                }
            }
            if id.is_some() {
                conn.respond(id, Response::Ok);
            }
            return;
        }
        match (request, objects, executor) {
            (Request::Owner(request), Some(objects), _) => {
                if let OwnerRequest::AddBorrower(AddBorrower {
                    ids,
                    borrower,
                    from_borrower: true,
                }) = &request
                {
                    self.borrows_here
                        .lock()
                        .entry(borrower.clone())
                        .or_default()
                        .extend(ids.iter().copied());
                }
                objects.handle(conn, id, request);
            }
            (Request::Executor(request), _, Some(executor)) => executor.handle(conn, id, request),
            (request, _, _) => conn.respond(
                id,
                Response::Error(Error::NotServed {
                    service: "this process (not ready, shutting down, or not its service)".into(),
                    request: format!("{request:?}"),
                }),
            ),
        }
    }

    fn closed(&self, conn: &Connection) {
        let Some(bound) = self.bound.get() else {
            return;
        };
        if let Some(objects) = bound.objects.upgrade() {
            let ended: Vec<(Address, Vec<ObjectId>)> = self.borrows_here.lock().drain().collect();
            for (borrower, ids) in ended {
                let releases = objects.refs.drop_borrower(&ids, &borrower);
                objects.apply_releases(releases);
            }
        }
        if bound.raylet_peer.as_deref() == Some(conn.peer()) {
            // Our raylet is gone: a worker has nothing left to do.
            std::process::exit(0);
        }
    }
}

/// A chunk of this process's executable, for a node that runs the job's
/// workers from its own copy. `/proc/self/exe` is the file this process
/// was started from even if a rebuild replaced it at its path since.
fn read_program(read: &ReadProgram) -> Result<bytes::Bytes, Error> {
    use std::io::{Read, Seek, SeekFrom};
    let this = Program::this().map_err(|message| Error::Cluster { message })?;
    if this.id != read.id {
        return Err(Error::Cluster {
            message: format!(
                "this process runs program {}, not {}: was the job's binary rebuilt and \
                 restarted while nodes still fetched it?",
                this.id, read.id
            ),
        });
    }
    if read.len > PROGRAM_CHUNK || read.offset > this.size {
        return Err(Error::Cluster {
            message: format!(
                "a program read of {} bytes at {} is out of bounds (the program has {} bytes, \
                 and one read takes at most {PROGRAM_CHUNK})",
                read.len, read.offset, this.size
            ),
        });
    }
    let len = read.len.min(this.size - read.offset) as usize;
    let mut chunk = vec![0u8; len];
    let mut file = std::fs::File::open("/proc/self/exe")
        .map_err(|e| Error::io("open this program's executable", e))?;
    file.seek(SeekFrom::Start(read.offset))
        .and_then(|_| file.read_exact(&mut chunk))
        .map_err(|e| Error::io("read this program's executable", e))?;
    Ok(chunk.into())
}

fn print_worker_output(label: &str, stream: Stream, lines: &[String]) {
    use std::io::Write;
    match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            for line in lines {
                let _ = writeln!(out, "({label}) {line}");
            }
        }
        Stream::Stderr => {
            let mut out = std::io::stderr().lock();
            for line in lines {
                let _ = writeln!(out, "({label}) {line}");
            }
        }
    }
}
