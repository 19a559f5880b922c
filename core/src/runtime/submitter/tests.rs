//! The submitter's leasing, reuse, retry and return logic, run against a
//! fake lease client ([`Fake`]) that records every call and answers lease
//! requests and pushed tasks as each test says.

use super::*;
use crate::runtime::lessee::Lessee;
use crate::runtime::lineage::Resubmit;
use crate::runtime::objects::ObjectsParts;
use crate::runtime::owned_actors::OwnedActors;
use crate::runtime::peers::Peers;
use crate::runtime::refs::Readiness;
use crate::runtime::store::StoreClient;
use crate::runtime::task_counts::TaskCounts;
use bytes::Bytes;
use prism_object_store::Segment;
use prism_protocol::ids::JobId;
use prism_protocol::messages::{ObjectValue, Request, TaskSpec};
use prism_protocol::resources::{Quantity, ResourceSet, CPU};
use prism_protocol::rpc::{Connection, Handler};
use std::sync::Weak;
use tokio::sync::{mpsc, oneshot};

/// The longest any one wait of a test may take (reached only on failure).
const WAIT: Duration = Duration::from_secs(2);

/// A call the submitter made of its lease client, naming the raylet or
/// worker it went to: `"local"` (this node's raylet), a spilled-to
/// raylet's address, or a granted worker's address.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    RequestLease(String),
    Remote(String),
    ReturnLease {
        raylet: String,
        lease_id: LeaseId,
        unreachable: bool,
    },
    Withdraw,
    ExitReason(String, WorkerId),
    Connect(String),
    Push(String, TaskId),
    Cancel(String, ObjectId),
}

/// A lease request waiting for the test's answer.
struct Asked {
    raylet: String,
    request: RequestLease,
    answer: oneshot::Sender<Result<LeaseReply>>,
}

/// A task pushed to a worker, waiting for the test's answer.
struct Pushed {
    worker: String,
    spec: TaskSpec,
    answer: Box<dyn FnOnce(Result<ReturnObject>) + Send>,
}

impl Pushed {
    fn answer(self, outcome: Result<ReturnObject>) {
        (self.answer)(outcome)
    }
}

/// The lease client of these tests: records each call, hands lease
/// requests and pushed tasks to the test to answer, and reaches every
/// worker but those marked unreachable.
#[derive(Debug)]
struct Fake {
    local: String,
    calls: Mutex<Vec<Call>>,
    asked: mpsc::UnboundedSender<Asked>,
    pushed: mpsc::UnboundedSender<Pushed>,
    unreachable: Mutex<HashSet<String>>,
}

/// Why the fake's raylet says a worker exited.
const EXIT_REASON: &str = "the test killed it";

impl Fake {
    fn record(&self, call: Call) {
        self.calls.lock().push(call);
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    /// The leases given back so far, as (raylet, lease, unreachable).
    fn returned(&self) -> Vec<(String, LeaseId, bool)> {
        (self.calls.lock().iter())
            .filter_map(|c| match c {
                Call::ReturnLease {
                    raylet,
                    lease_id,
                    unreachable,
                } => Some((raylet.clone(), *lease_id, *unreachable)),
                _ => None,
            })
            .collect()
    }

    fn count(&self, pick: impl Fn(&Call) -> bool) -> usize {
        self.calls.lock().iter().filter(|c| pick(c)).count()
    }
}

impl LeaseClient for Fake {
    type Raylet = String;
    type Worker = String;

    fn local(&self) -> &String {
        &self.local
    }

    async fn remote(&self, address: &str) -> Result<String> {
        self.record(Call::Remote(address.to_string()));
        Ok(address.to_string())
    }

    async fn request_lease(&self, raylet: &String, request: RequestLease) -> Result<LeaseReply> {
        self.record(Call::RequestLease(raylet.clone()));
        let (answer, rx) = oneshot::channel();
        let asked = Asked {
            raylet: raylet.clone(),
            request,
            answer,
        };
        let gone = || Error::Disconnected {
            peer: raylet.clone(),
        };
        self.asked.send(asked).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    fn return_lease(&self, raylet: &String, lease: ReturnLease) -> Result<()> {
        self.record(Call::ReturnLease {
            raylet: raylet.clone(),
            lease_id: lease.lease_id,
            unreachable: lease.unreachable,
        });
        Ok(())
    }

    fn withdraw_requests(&self, _: CancelLeaseRequests) -> Result<()> {
        self.record(Call::Withdraw);
        Ok(())
    }

    async fn worker_exit_reason(
        &self,
        raylet: &String,
        request: WorkerExitReason,
    ) -> Result<Option<String>> {
        self.record(Call::ExitReason(raylet.clone(), request.worker_id));
        Ok(Some(EXIT_REASON.into()))
    }

    async fn worker(&self, address: &str) -> Result<String> {
        self.record(Call::Connect(address.to_string()));
        if self.unreachable.lock().contains(address) {
            return Err(Error::Disconnected {
                peer: address.to_string(),
            });
        }
        Ok(address.to_string())
    }

    fn push_task(
        &self,
        worker: &String,
        task: PushTask,
        on_answer: impl FnOnce(Result<ReturnObject>) + Send + 'static,
    ) {
        self.record(Call::Push(worker.clone(), task.spec.task_id));
        let _ = self.pushed.send(Pushed {
            worker: worker.clone(),
            spec: task.spec,
            answer: Box::new(on_answer),
        });
    }

    fn cancel_task(&self, worker: &String, cancel: CancelTask) -> Result<()> {
        self.record(Call::Cancel(worker.clone(), cancel.return_id));
        Ok(())
    }
}

/// Serves nothing: the far end of the raylet connection `Objects` holds.
struct Ignores;

impl Handler for Ignores {
    fn handle(&self, _: &Connection, _: Option<u64>, _: Request) {}
}

/// A submitter on a fake lease client, with the test's ends of it.
struct Setup {
    submitter: Arc<TaskSubmitter<Fake>>,
    asked: mpsc::UnboundedReceiver<Asked>,
    pushed: mpsc::UnboundedReceiver<Pushed>,
    /// Kept open while the test runs.
    _store: Segment,
    _raylet: Connection,
}

/// A submitter whose idle workers go back after `lease_idle_ms`, built
/// on real `Objects` (with a raylet connection nothing answers on).
fn setup(lease_idle_ms: u64) -> Setup {
    let rt = tokio::runtime::Handle::current();
    let config = Arc::new(Config {
        lease_idle_ms,
        ..Config::default()
    });
    let (a, b) = tokio::net::UnixStream::pair().expect("a socket pair");
    let raylet = Connection::start(a, "raylet".into(), Arc::new(Ignores));
    let far_end = Connection::start(b, "core".into(), Arc::new(Ignores));
    let segment = Segment::create("submitter-test", 4096).expect("a store segment");
    let store = StoreClient::open(raylet.clone(), segment.path(), None).expect("the store");
    let peers = Arc::new(Peers::new(
        "node".into(),
        Box::new(|| Arc::new(Ignores) as Arc<dyn Handler>),
    ));
    let address: String = "/tmp/submitter-test.sock".into();
    let lessee = Arc::new(Lessee::new(
        peers.clone(),
        address.clone(),
        JobId::new(),
        false,
        String::new(),
        Default::default(),
    ));
    let owned_actors = Arc::new(OwnedActors::new(rt.clone(), raylet.clone(), lessee));
    let task_counts = Arc::new(TaskCounts::new(
        "job".into(),
        false,
        Box::new(|_| Vec::new()),
    ));
    let (asked_tx, asked) = mpsc::unbounded_channel();
    let (pushed_tx, pushed) = mpsc::unbounded_channel();
    let submitter = Arc::new_cyclic(|me: &Weak<TaskSubmitter<Fake>>| {
        let resubmit: Weak<dyn Resubmit> = me.clone();
        let objects = Arc::new(Objects::new(
            rt.clone(),
            config.clone(),
            false,
            raylet,
            address,
            ObjectsParts {
                store,
                peers,
                owned_actors,
                task_counts,
                resubmit,
            },
        ));
        let fake = Fake {
            local: "local".into(),
            calls: Mutex::new(Vec::new()),
            asked: asked_tx,
            pushed: pushed_tx,
            unreachable: Mutex::new(HashSet::new()),
        };
        TaskSubmitter::new(rt.clone(), config.clone(), objects, fake)
    });
    Setup {
        submitter,
        asked,
        pushed,
        _store: segment,
        _raylet: far_end,
    }
}

/// The shape every test's tasks take: one CPU.
fn shape() -> SchedulingKey {
    let mut shape = ResourceSet::new();
    shape.set(CPU, Quantity::whole(1));
    SchedulingKey {
        shape,
        bundle: None,
        strategy: Default::default(),
        env_vars: Default::default(),
    }
}

/// A grant of the worker at `address`, with a fresh lease.
fn grant(address: &str) -> LeaseReply {
    LeaseReply::Granted(LeaseGrant {
        lease_id: LeaseId::new(),
        worker_id: WorkerId::new(),
        address: address.into(),
        pid: 4242,
        contended: false,
    })
}

/// A worker's answer: one inline value.
fn value(bytes: &'static [u8]) -> ReturnObject {
    ReturnObject {
        value: ObjectValue::Inline(Bytes::from_static(bytes)),
        contained: Vec::new(),
        more: Vec::new(),
    }
}

/// The answer of a worker that went away mid-task.
fn disconnected(worker: &str) -> Result<ReturnObject> {
    Err(Error::Disconnected {
        peer: worker.into(),
    })
}

impl Setup {
    fn fake(&self) -> &Fake {
        &self.submitter.leases
    }

    /// Submits a call of `function` (no arguments) with `retries`; its
    /// result object.
    fn submit(&self, function: &str, retries: i64) -> ObjectId {
        let objects = self.submitter.objects();
        let id = ObjectId::new();
        objects.new_pending(id);
        let caller = objects.address().clone();
        let spec = TaskSpec::new(function.into(), Vec::new(), id, Vec::new(), caller);
        let submission = Submission::new(spec, Vec::new()).retries(retries, false, Vec::new());
        self.submitter.submit(shape(), submission);
        id
    }

    /// The next lease request.
    async fn asked(&mut self) -> Asked {
        let next = tokio::time::timeout(WAIT, self.asked.recv()).await;
        next.expect("a lease request within the wait")
            .expect("the fake lives")
    }

    /// The next task pushed to a worker.
    async fn pushed(&mut self) -> Pushed {
        let next = tokio::time::timeout(WAIT, self.pushed.recv()).await;
        next.expect("a task pushed within the wait")
            .expect("the fake lives")
    }

    /// Grants the next lease request the worker at `address`; its lease.
    async fn grant_next(&mut self, address: &str) -> LeaseId {
        let asked = self.asked().await;
        let reply = grant(address);
        let LeaseReply::Granted(g) = &reply else {
            unreachable!("a grant")
        };
        let lease_id = g.lease_id;
        let _ = asked.answer.send(Ok(reply));
        lease_id
    }

    /// What the task making `id` settled with.
    async fn settled(&self, id: ObjectId) -> Result<ObjectValue> {
        let refs = &self.submitter.objects().refs;
        loop {
            match refs.readiness(id) {
                Readiness::Ready(value, _) => return Ok(value),
                Readiness::Failed(e) => return Err(e),
                Readiness::Wait(rx) => {
                    let woke = tokio::time::timeout(WAIT, rx).await;
                    woke.expect("settled within the wait")
                        .expect("the waiter is told");
                }
            }
        }
    }

    /// Waits until the fake saw `lease` given back.
    async fn given_back(&self, lease: LeaseId) -> (String, bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let found = (self.fake().returned().into_iter())
                .find(|(_, id, _)| *id == lease)
                .map(|(raylet, _, unreachable)| (raylet, unreachable));
            if let Some(found) = found {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "lease {lease} given back within the wait: {:?}",
                self.fake().calls()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

fn inline(value: Result<ObjectValue>) -> Bytes {
    match value {
        Ok(ObjectValue::Inline(bytes)) => bytes,
        other => panic!("expected an inline value, got {other:?}"),
    }
}

#[tokio::test]
async fn a_task_is_leased_a_worker_pushed_to_it_and_settles() {
    let mut s = setup(60_000);
    let id = s.submit("f", 0);
    let asked = s.asked().await;
    assert_eq!(asked.raylet, "local");
    assert_eq!(asked.request.shape, shape().shape, "leased for its shape");
    let reply = grant("w1");
    let _ = asked.answer.send(Ok(reply));
    let pushed = s.pushed().await;
    assert_eq!(pushed.worker, "w1", "sent to the worker granted");
    assert_eq!(pushed.spec.return_id, id);
    let task_id = pushed.spec.task_id;
    assert!(
        s.submitter.objects().refs.is_pending(id),
        "not yet answered"
    );
    pushed.answer(Ok(value(b"42")));
    assert_eq!(inline(s.settled(id).await), Bytes::from_static(b"42"));
    assert_eq!(
        s.fake().calls(),
        [
            Call::RequestLease("local".into()),
            Call::Connect("w1".into()),
            Call::Push("w1".into(), task_id),
        ],
        "one lease, one connection, one push; the worker is kept"
    );
}

#[tokio::test]
async fn two_tasks_of_one_shape_reuse_one_worker() {
    let mut s = setup(60_000);
    let first = s.submit("f", 0);
    let lease = s.grant_next("w1").await;
    s.pushed().await.answer(Ok(value(b"1")));
    assert_eq!(inline(s.settled(first).await), Bytes::from_static(b"1"));
    // The worker is idle and held: the second task goes straight to it.
    let second = s.submit("g", 0);
    let pushed = s.pushed().await;
    assert_eq!(pushed.worker, "w1");
    assert_eq!(pushed.spec.return_id, second);
    pushed.answer(Ok(value(b"2")));
    assert_eq!(inline(s.settled(second).await), Bytes::from_static(b"2"));
    assert!(s.asked.try_recv().is_err(), "no second lease request");
    let fake = s.fake();
    assert_eq!(fake.count(|c| matches!(c, Call::RequestLease(_))), 1);
    assert_eq!(
        fake.count(|c| matches!(c, Call::Push(w, _) if w == "w1")),
        2
    );
    assert!(fake.returned().is_empty(), "lease {lease} still held");
}

#[tokio::test]
async fn tasks_queued_together_run_one_after_another_on_the_worker_granted() {
    let mut s = setup(60_000);
    let first = s.submit("f", 0);
    let second = s.submit("g", 0);
    // One request per waiting task; the first grant serves both, and the
    // other request is withdrawn once the tasks run out.
    let one = s.asked().await;
    let other = s.asked().await;
    let _ = one.answer.send(Ok(grant("w1")));
    let pushed = s.pushed().await;
    assert_eq!(pushed.spec.return_id, first);
    pushed.answer(Ok(value(b"1")));
    let pushed = s.pushed().await;
    assert_eq!(
        (pushed.worker.as_str(), pushed.spec.return_id),
        ("w1", second)
    );
    assert_eq!(s.fake().count(|c| *c == Call::Withdraw), 0);
    pushed.answer(Ok(value(b"2")));
    assert_eq!(inline(s.settled(second).await), Bytes::from_static(b"2"));
    assert_eq!(s.fake().count(|c| *c == Call::Withdraw), 1, "withdrawn");
    // The raylet answers the withdrawn request as withdrawn: nothing more
    // is asked or sent.
    let _ = other.answer.send(Ok(LeaseReply::Cancelled));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(s.asked.try_recv().is_err(), "not asked again");
    assert!(s.pushed.try_recv().is_err(), "nothing else sent");
}

#[tokio::test]
async fn a_task_whose_worker_died_runs_again_on_a_new_lease() {
    let mut s = setup(60_000);
    let id = s.submit("f", 1);
    let dead = s.grant_next("w1").await;
    s.pushed().await.answer(disconnected("w1"));
    // The attempt counts, and the task asks for a new worker.
    let lease = s.grant_next("w2").await;
    let pushed = s.pushed().await;
    assert_eq!((pushed.worker.as_str(), pushed.spec.return_id), ("w2", id));
    pushed.answer(Ok(value(b"again")));
    assert_eq!(inline(s.settled(id).await), Bytes::from_static(b"again"));
    let fake = s.fake();
    assert_eq!(
        fake.count(|c| matches!(c, Call::ExitReason(r, _) if r == "local")),
        1,
        "the raylet is asked why the worker died"
    );
    assert!(
        fake.returned().is_empty(),
        "the dead worker's lease {dead} is freed by its raylet, and {lease} is held"
    );
}

#[tokio::test]
async fn a_task_with_no_retries_left_fails_with_its_workers_death() {
    let mut s = setup(60_000);
    let id = s.submit("f", 1);
    s.grant_next("w1").await;
    s.pushed().await.answer(disconnected("w1"));
    s.grant_next("w2").await;
    let pushed = s.pushed().await;
    assert_eq!(pushed.worker, "w2");
    pushed.answer(disconnected("w2"));
    match s.settled(id).await {
        Err(Error::WorkerDied {
            function,
            pid,
            reason,
            ..
        }) => {
            assert_eq!((function.as_str(), pid), ("f", 4242));
            assert!(reason.contains(EXIT_REASON), "{reason}");
            assert!(reason.contains("attempt 2 of 2"), "{reason}");
        }
        other => panic!("expected the worker's death, got {other:?}"),
    }
    assert!(s.asked.try_recv().is_err(), "not asked a third time");
    assert_eq!(s.fake().count(|c| matches!(c, Call::Push(..))), 2);
}

#[tokio::test]
async fn an_idle_worker_goes_back_after_the_idle_period() {
    let mut s = setup(30);
    let id = s.submit("f", 0);
    let lease = s.grant_next("w1").await;
    s.pushed().await.answer(Ok(value(b"1")));
    let idle = std::time::Instant::now();
    s.settled(id).await.expect("a value");
    assert!(s.fake().returned().is_empty(), "held while idle");
    let (raylet, unreachable) = s.given_back(lease).await;
    assert!(idle.elapsed() >= Duration::from_millis(30), "not before");
    assert_eq!((raylet.as_str(), unreachable), ("local", false));
    assert_eq!(s.fake().returned().len(), 1);
}

#[tokio::test]
async fn a_wanted_idle_worker_goes_back_at_once() {
    let mut s = setup(60_000);
    let id = s.submit("f", 0);
    let lease = s.grant_next("w1").await;
    s.pushed().await.answer(Ok(value(b"1")));
    s.settled(id).await.expect("a value");
    assert!(s.fake().returned().is_empty(), "held while idle");
    s.submitter.leases_wanted(&[lease]);
    assert_eq!(s.fake().returned(), [("local".to_string(), lease, false)]);
    // A task after it needs a new lease.
    s.submit("g", 0);
    s.asked().await;
}

#[tokio::test]
async fn a_wanted_busy_worker_goes_back_when_its_task_answers() {
    let mut s = setup(60_000);
    let id = s.submit("f", 0);
    let lease = s.grant_next("w1").await;
    let pushed = s.pushed().await;
    s.submitter.leases_wanted(&[lease]);
    assert!(s.fake().returned().is_empty(), "kept while it runs");
    pushed.answer(Ok(value(b"1")));
    s.settled(id).await.expect("a value");
    assert_eq!(s.fake().returned(), [("local".to_string(), lease, false)]);
}

#[tokio::test]
async fn a_failed_lease_request_fails_the_task_with_its_error() {
    let mut s = setup(60_000);
    let id = s.submit("f", 3);
    let asked = s.asked().await;
    let _ = asked.answer.send(Err(Error::Infeasible {
        shape: "{CPU: 1}".into(),
        total: "{}".into(),
    }));
    match s.settled(id).await {
        Err(Error::Infeasible { shape, .. }) => assert_eq!(shape, "{CPU: 1}"),
        other => panic!("expected the raylet's refusal, got {other:?}"),
    }
    assert!(s.pushed.try_recv().is_err(), "nothing was sent");
    assert!(s.asked.try_recv().is_err(), "not asked again");
}

#[tokio::test]
async fn a_spilled_back_lease_is_asked_of_the_other_raylet_and_goes_back_there() {
    let mut s = setup(30);
    let id = s.submit("f", 0);
    let asked = s.asked().await;
    let _ = asked.answer.send(Ok(LeaseReply::Spillback {
        raylet: "raylet-b".into(),
        node_id: "node-b".into(),
    }));
    let lease = s.grant_next("w-on-b").await;
    s.pushed().await.answer(Ok(value(b"b")));
    s.settled(id).await.expect("a value");
    assert_eq!(s.given_back(lease).await, ("raylet-b".to_string(), false));
    let fake = s.fake();
    assert_eq!(
        fake.calls()[..4],
        [
            Call::RequestLease("local".into()),
            Call::Remote("raylet-b".into()),
            Call::RequestLease("raylet-b".into()),
            Call::Connect("w-on-b".into()),
        ]
    );
}

#[tokio::test]
async fn a_request_waiting_where_it_was_sent_goes_on_to_a_node_with_room_a_bounded_number_of_times()
{
    let mut s = setup(30);
    let id = s.submit("f", 0);
    // Its own node sends it to b (hop 1); b, where it waits, sends it on
    // to c (hop 2), and c to d (hop 3).
    let asked = s.asked().await;
    assert_eq!(asked.request.hops, 0);
    let _ = asked.answer.send(Ok(LeaseReply::Spillback {
        raylet: "b".into(),
        node_id: "node-b".into(),
    }));
    let mut hops = Vec::new();
    for (raylet, next) in [("b", "c"), ("c", "d")] {
        let asked = s.asked().await;
        assert_eq!(asked.raylet, raylet);
        hops.push(asked.request.hops);
        let _ = asked.answer.send(Ok(LeaseReply::Spillback {
            raylet: next.into(),
            node_id: format!("node-{next}"),
        }));
    }
    // d, at the last hop, must not send it on: if it does, the task fails
    // saying so rather than travelling on.
    let asked = s.asked().await;
    assert_eq!(asked.raylet, "d");
    hops.push(asked.request.hops);
    assert_eq!(hops, [1, 2, 3]);
    let _ = asked.answer.send(Ok(LeaseReply::Spillback {
        raylet: "e".into(),
        node_id: "node-e".into(),
    }));
    match s.settled(id).await {
        Err(Error::SentOnAgain { node_id, .. }) => assert_eq!(node_id, "node-d"),
        other => panic!("expected SentOnAgain from node-d, got {other:?}"),
    }
}

#[tokio::test]
async fn an_unreachable_worker_goes_back_as_such_and_another_is_leased() {
    let mut s = setup(60_000);
    s.fake().unreachable.lock().insert("gone".into());
    let id = s.submit("f", 0);
    let lost = s.grant_next("gone").await;
    assert_eq!(s.given_back(lost).await, ("local".to_string(), true));
    s.grant_next("w2").await;
    let pushed = s.pushed().await;
    assert_eq!(pushed.worker, "w2");
    pushed.answer(Ok(value(b"2")));
    assert_eq!(inline(s.settled(id).await), Bytes::from_static(b"2"));
}

#[tokio::test]
async fn a_cancelled_task_on_a_worker_is_cancelled_there_and_ends_cancelled() {
    let mut s = setup(60_000);
    let id = s.submit("f", 0);
    s.grant_next("w1").await;
    let pushed = s.pushed().await;
    s.submitter.cancel(id, id, false);
    assert_eq!(
        s.fake().count(|c| *c == Call::Cancel("w1".into(), id)),
        1,
        "the worker is told"
    );
    pushed.answer(Ok(value(b"late")));
    assert!(
        matches!(s.settled(id).await, Err(Error::TaskCancelled { .. })),
        "ends cancelled whatever the worker answered"
    );
}
