//! Serving what other processes send this one: the handler serves the
//! executor, owner and driver services (`ExecutorServer`, `OwnerServer`,
//! `DriverServer`), one `Serve` implementation per request. Executor
//! requests go to the [`Executor`], owner requests to [`Objects`], the
//! driver's notices to the component that owns what they are about; a
//! driver prints the worker output the raylet forwards.

use super::executor::Executor;
use super::objects::Objects;
use super::owned_actors::OwnedActors;
use super::submitter::TaskSubmitter;
use crate::Error;
use parking_lot::Mutex;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::{
    ActorCall, ActorEnded, ActorRestarted, AddBorrower, Address, BecomeActor, Call, CancelTask,
    DumpStacks, GetObjectStatus, LeasesWanted, LocateActor, NodeDied, PushTask, ReadProgram,
    RemoveBorrower, Request, Response, Stream, StreamItem, WorkerOutput, PROGRAM_CHUNK,
};
use prism_protocol::program::Program;
use prism_protocol::rpc::{Connection, Handler};
use prism_protocol::serve::{Answer, Serve};
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

impl CoreHandler {
    fn objects(&self) -> Option<Arc<Objects>> {
        self.bound.get().and_then(|b| b.objects.upgrade())
    }

    fn executor(&self) -> Option<Arc<Executor>> {
        self.bound.get().and_then(|b| b.executor.upgrade())
    }

    fn owned_actors(&self) -> Option<Arc<OwnedActors>> {
        self.bound.get().and_then(|b| b.owned_actors.upgrade())
    }

    fn tasks(&self) -> Option<Arc<TaskSubmitter>> {
        self.bound.get().and_then(|b| b.tasks.upgrade())
    }
}

/// The answer of a process that cannot serve a request now: its runtime is
/// not built yet or is shutting down.
fn not_ready<C: Call>(answer: Answer<C>) {
    answer.send(Err(Error::NotServed {
        service: "this process (not ready, or shutting down)".into(),
        request: C::NAME.into(),
    }))
}

impl Handler for CoreHandler {
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
        match request {
            Request::Executor(request) => request.dispatch(self, conn, id),
            Request::Owner(request) => request.dispatch(self, conn, id),
            Request::Driver(request) => request.dispatch(self, conn, id),
            Request::Raylet(request) => conn.respond(
                id,
                Response::Error(Error::NotServed {
                    service: "a driver or worker (the raylet serves it)".into(),
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

// The executor service: tasks and actor calls.

impl Serve<PushTask> for CoreHandler {
    fn serve(&self, request: PushTask, answer: Answer<PushTask>) {
        match self.executor() {
            Some(executor) => executor.serve_push_task(request, answer),
            None => not_ready(answer),
        }
    }
}

impl Serve<CancelTask> for CoreHandler {
    fn serve(&self, request: CancelTask, answer: Answer<CancelTask>) {
        match self.executor() {
            Some(executor) => executor.serve_cancel_task(request, answer),
            None => not_ready(answer),
        }
    }
}

impl Serve<ActorCall> for CoreHandler {
    fn serve(&self, request: ActorCall, answer: Answer<ActorCall>) {
        match self.executor() {
            Some(executor) => executor.serve_actor_call(request, answer),
            None => not_ready(answer),
        }
    }
}

impl Serve<BecomeActor> for CoreHandler {
    fn serve(&self, request: BecomeActor, answer: Answer<BecomeActor>) {
        match self.executor() {
            Some(executor) => executor.serve_become_actor(request, answer),
            None => not_ready(answer),
        }
    }
}

impl Serve<DumpStacks> for CoreHandler {
    fn serve(&self, request: DumpStacks, answer: Answer<DumpStacks>) {
        match self.executor() {
            Some(executor) => executor.serve_dump_stacks(request, answer),
            None => not_ready(answer),
        }
    }
}

// The owner service: the values and borrowers of what this process owns.

impl Serve<GetObjectStatus> for CoreHandler {
    fn serve(&self, request: GetObjectStatus, answer: Answer<GetObjectStatus>) {
        match self.objects() {
            Some(objects) => objects.serve_status(request, answer),
            None => not_ready(answer),
        }
    }
}

impl Serve<AddBorrower> for CoreHandler {
    fn serve(&self, request: AddBorrower, answer: Answer<AddBorrower>) {
        let Some(objects) = self.objects() else {
            return not_ready(answer);
        };
        if request.from_borrower {
            // Registered by the borrower itself: when this connection
            // closes, that process is gone, and so are its borrows.
            self.borrows_here
                .lock()
                .entry(request.borrower.clone())
                .or_default()
                .extend(request.ids.iter().copied());
        }
        objects.serve_add_borrower(request, answer)
    }
}

impl Serve<RemoveBorrower> for CoreHandler {
    fn serve(&self, request: RemoveBorrower, answer: Answer<RemoveBorrower>) {
        match self.objects() {
            Some(objects) => objects.serve_remove_borrower(request, answer),
            None => not_ready(answer),
        }
    }
}

impl Serve<StreamItem> for CoreHandler {
    fn serve(&self, request: StreamItem, answer: Answer<StreamItem>) {
        match self.objects() {
            Some(objects) => objects.serve_stream_item(request, answer),
            None => not_ready(answer),
        }
    }
}

impl Serve<LocateActor> for CoreHandler {
    fn serve(&self, request: LocateActor, answer: Answer<LocateActor>) {
        match self.objects() {
            Some(objects) => objects.serve_locate_actor(request, answer),
            None => not_ready(answer),
        }
    }
}

// The driver service: notices from the raylet and other nodes.

impl Serve<NodeDied> for CoreHandler {
    fn serve(&self, request: NodeDied, answer: Answer<NodeDied>) {
        if let Some(objects) = self.objects() {
            let n = objects.peers.abandon_node(&request.node_id);
            tracing::warn!(node = %request.node_id, connections = n, "a node died; its connections were given up");
            if let Some(owned_actors) = self.owned_actors() {
                owned_actors.node_died(&request.node_id);
            }
        }
        answer.send(Ok(()))
    }
}

impl Serve<ActorEnded> for CoreHandler {
    fn serve(&self, request: ActorEnded, answer: Answer<ActorEnded>) {
        if let Some(owned_actors) = self.owned_actors() {
            owned_actors.ended(request.actor_id);
        }
        answer.send(Ok(()))
    }
}

impl Serve<ActorRestarted> for CoreHandler {
    fn serve(&self, request: ActorRestarted, answer: Answer<ActorRestarted>) {
        if let Some(owned_actors) = self.owned_actors() {
            owned_actors.seen_restarts(request.actor_id, request.num_restarts);
        }
        answer.send(Ok(()))
    }
}

impl Serve<LeasesWanted> for CoreHandler {
    fn serve(&self, request: LeasesWanted, answer: Answer<LeasesWanted>) {
        if let Some(tasks) = self.tasks() {
            tasks.leases_wanted(&request.leases);
        }
        answer.send(Ok(()))
    }
}

impl Serve<ReadProgram> for CoreHandler {
    fn serve(&self, request: ReadProgram, answer: Answer<ReadProgram>) {
        // Off the connection's reader: a chunk is megabytes of file.
        tokio::task::spawn_blocking(move || answer.send(read_program(&request)));
    }
}

impl Serve<WorkerOutput> for CoreHandler {
    fn serve(&self, request: WorkerOutput, answer: Answer<WorkerOutput>) {
        print_worker_output(&request.label, request.stream, &request.lines);
        answer.send(Ok(()))
    }
}

/// A chunk of this process's executable, for a node that runs the job's
/// workers from its own copy. `/proc/self/exe` is the file this process
/// was started from even if a rebuild replaced it at its path since.
fn read_program(read: &ReadProgram) -> Result<bytes::Bytes, Error> {
    use std::io::{Read, Seek, SeekFrom};
    let refuse = |reason: String| Error::ProgramUnavailable {
        holder: format!("process {}", std::process::id()),
        reason,
    };
    let this = Program::this().map_err(refuse)?;
    if this.id != read.id {
        return Err(refuse(format!(
            "it runs program {}, not {}: was the job's binary rebuilt and restarted while \
             nodes still fetched it?",
            this.id, read.id
        )));
    }
    if read.len > PROGRAM_CHUNK || read.offset > this.size {
        return Err(refuse(format!(
            "a program read of {} bytes at {} is out of bounds (the program has {} bytes, and \
             one read takes at most {PROGRAM_CHUNK})",
            read.len, read.offset, this.size
        )));
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
