//! Streaming calls (`num_returns = "streaming"`, Ray's generators).
//!
//! A streaming function returns an iterator. Its executor stores each value
//! as it is made, as a task result is stored, under an id it mints, and
//! sends it to the caller ([`StreamItem`]); the caller answers once it took
//! the value as its own object. Values are sent without waiting for
//! their answers, up to a window ([`IN_FLIGHT`], or the call's
//! backpressure `n`), and the call answers (with the number of values)
//! only after every value was answered, so the caller has taken in every
//! value when it learns the call ended. The executor does not wait for
//! the caller's code to read a value: values not read yet wait in the
//! caller's stream (as Ray's generators), unless the call has
//! backpressure: then the caller holds its answers back while more than
//! `n` values wait unread, and the executor, its window full, pauses.
//! The caller's
//! [`ObjectRefGenerator`](crate::ObjectRefGenerator) hands out the values'
//! references in order; it has seen every value once the call answered.
//!
//! Executor side: [`ItemSink`] is installed on the thread that runs the
//! call (a thread-local, as the call runs user code there) and
//! [`emit_all`] drives the iterator into it. A cancel stops the iterator
//! between two values.
//!
//! Caller side: [`Streams`] holds, per open generator, the values that
//! arrived and are not taken yet. A retried call sends its values from
//! the first again: a value the generator handed out already is freed at
//! once, one it holds untaken is replaced by the new copy (the old one
//! may have been lost with its node). A value arriving for a generator
//! that was dropped is freed, and its answer tells the executor, which
//! ends the call (cancelled) instead of making more.

use super::local_ref::LocalRef;
use super::refs::Release;
use super::registry::{CallError, CallResult};
use crate::Error;
use parking_lot::Mutex;
use prism_protocol::ids::{IdMap, ObjectId};
use prism_protocol::messages::{Address, Response};
use prism_protocol::rpc::Connection;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

/// One stream's values that arrived and were not taken yet.
pub(crate) struct Stream {
    state: Mutex<StreamState>,
    /// Signalled when a value arrives (one waiter: the generator).
    pub(crate) arrived: tokio::sync::Notify,
    /// The call's `generator_backpressure`: while more values than this
    /// wait untaken, their answers are held back (0: never).
    limit: usize,
}

/// An answer held back: where it goes.
pub(crate) type Held = (Connection, Option<u64>);

#[derive(Default)]
struct StreamState {
    items: BTreeMap<u64, Arc<LocalRef>>,
    /// Values before this index were taken.
    taken: u64,
    /// Answers held back while too many values wait, oldest first.
    held: Vec<Held>,
    /// The call was cancelled: no answer is held back any more.
    cancelled: bool,
}

impl StreamState {
    /// Whether an answer must be held back now: more than `limit` values
    /// wait, the next one to take among them (a gap, a value lost on the
    /// way, never pauses the call), and the call was not cancelled.
    fn holds(&self, limit: usize) -> bool {
        limit > 0
            && !self.cancelled
            && self.items.len() > limit
            && self.items.contains_key(&self.taken)
    }
}

impl Stream {
    /// The value at `index`, if it arrived. Taking one may release the
    /// answers held back for the values that came after it.
    pub(crate) fn take(&self, index: u64) -> Option<Arc<LocalRef>> {
        let (item, released) = {
            let mut state = self.state.lock();
            let item = state.items.remove(&index)?;
            state.taken = state.taken.max(index + 1);
            let released = if state.holds(self.limit) {
                Vec::new()
            } else {
                std::mem::take(&mut state.held)
            };
            (item, released)
        };
        answer(released, || Response::Ok);
        Some(item)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Nobody will read: the executor learns the stream is closed.
        answer(self.state.get_mut().held.drain(..), closed);
    }
}

/// Sends answers held back (outside any stream lock).
fn answer(held: impl IntoIterator<Item = Held>, response: impl Fn() -> Response) {
    for (conn, request) in held {
        conn.respond(request, response());
    }
}

/// The answer to a value of a stream that ended: its executor stops.
fn closed() -> Response {
    Response::Error(stream_closed())
}

/// The open streams of this process's calls, by the call's `return_id`.
#[derive(Default)]
pub(crate) struct Streams {
    open: Mutex<IdMap<ObjectId, Arc<Stream>>>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("open", &self.open.lock().len())
            .finish()
    }
}

impl Streams {
    /// Opens the stream of a call about to be submitted, holding back
    /// answers while more than `limit` values wait (0: never).
    pub(crate) fn open(&self, generator: ObjectId, limit: u32) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            state: Mutex::default(),
            arrived: tokio::sync::Notify::new(),
            limit: limit as usize,
        });
        self.open.lock().insert(generator, stream.clone());
        stream
    }

    /// The call was cancelled: a stream paused by its backpressure would
    /// keep the call from seeing the cancel (the executor waits for an
    /// answer), so the answers held back go now, saying the stream ended,
    /// and none is held from now on. The values stay for the generator.
    pub(crate) fn cancelled(&self, generator: ObjectId) {
        let Some(stream) = self.open.lock().get(&generator).cloned() else {
            return;
        };
        let released = {
            let mut state = stream.state.lock();
            state.cancelled = true;
            std::mem::take(&mut state.held)
        };
        answer(released, closed);
    }

    /// The generator was dropped: values arriving from now on are freed.
    pub(crate) fn close(&self, generator: ObjectId) {
        let closed = self.open.lock().remove(&generator);
        drop(closed);
    }

    /// Value `index` of `generator` arrived as `item` (one local handle):
    /// kept for the generator, or dropped (and so freed) when nobody will
    /// take it. Returns `Closed` when the generator is gone, `Held` when
    /// `answer` was kept to be sent once the generator reads (the stream's
    /// limit is reached), `Taken` otherwise.
    pub(crate) fn offer(
        &self,
        generator: ObjectId,
        index: u64,
        item: Arc<LocalRef>,
        answer: Option<Held>,
    ) -> Offered {
        let Some(stream) = self.open.lock().get(&generator).cloned() else {
            return Offered::Closed;
        };
        let (unwanted, offered) = {
            let mut state = stream.state.lock();
            let unwanted = if index < state.taken {
                Some(item)
            } else {
                // A copy from an earlier run, not taken yet, gives way.
                state.items.insert(index, item)
            };
            let offered = match answer {
                Some(answer) if state.holds(stream.limit) => {
                    state.held.push(answer);
                    Offered::Held
                }
                _ => Offered::Taken,
            };
            (unwanted, offered)
        };
        // Freed outside the stream's lock.
        drop(unwanted);
        stream.arrived.notify_one();
        offered
    }
}

/// What became of a value that arrived.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Offered {
    /// Kept for the generator; answer now.
    Taken,
    /// Kept, and its answer will be sent once the generator reads.
    Held,
    /// The generator is gone: the value was freed.
    Closed,
}

/// Whether the caller cancelled the running streaming call.
pub(crate) type Stop = Box<dyn Fn() -> bool>;

/// Values a streaming call sends before it waits for the caller's answers
/// to the oldest: the sends overlap the caller's round trips, and at most
/// this many values (inline ones up to 100 KiB each) are in flight.
const IN_FLIGHT: usize = 64;

/// A value sent and not yet answered: the caller's answer (`None` when the
/// caller is this process and took it in already), and the value's copy
/// in the store, deleted if the caller never takes it in.
pub(crate) struct ItemAck {
    pub(crate) answer: Option<tokio::sync::oneshot::Receiver<prism_protocol::messages::Response>>,
    pub(crate) copy: Option<Release>,
}

/// How the values of a streaming call leave this process: the executor
/// running the call implements it (see `Executor::send_item`).
pub(crate) trait ItemSender {
    /// Stores value `index` of the call `generator` and sends it to
    /// `owner`; the caller's answer comes with the returned ack.
    fn send_item(
        &self,
        generator: ObjectId,
        index: u64,
        owner: &Address,
        encoded: crate::codec::Encoded,
    ) -> crate::Result<ItemAck>;

    /// Waits for the answers to `acks`, oldest first; the first failure.
    fn settle_items(&self, acks: Vec<ItemAck>) -> crate::Result<()>;

    /// The oldest of `acks` if answered already (taken off the front),
    /// without waiting.
    fn settle_answered(
        &self,
        acks: &mut std::collections::VecDeque<ItemAck>,
    ) -> Option<crate::Result<()>>;
}

/// Where the values of the streaming call running on this thread go.
pub(crate) struct ItemSink {
    /// Sends them.
    sender: Box<dyn ItemSender>,
    /// The call's `return_id`.
    pub(crate) generator: ObjectId,
    /// The caller.
    pub(crate) owner: Address,
    /// True once the caller cancelled the call: no further value is made.
    stop: Stop,
    /// Values sent so far.
    sent: std::cell::Cell<u64>,
    /// The call's function streamed (it may not, if the caller and this
    /// worker were built from different code).
    used: std::cell::Cell<bool>,
    /// Values sent whose answers were not read yet, oldest first.
    in_flight: RefCell<std::collections::VecDeque<ItemAck>>,
    /// The most values unanswered at once.
    window: usize,
}

thread_local! {
    static SINK: RefCell<Option<Rc<ItemSink>>> = const { RefCell::new(None) };
}

/// Installs a sink on this thread while the call runs; dropping it takes
/// it off again.
pub(crate) struct SinkGuard(Rc<ItemSink>);

impl SinkGuard {
    /// `backpressure`: the call's `stream_backpressure` (0: none).
    pub(crate) fn enter(
        sender: Box<dyn ItemSender>,
        generator: ObjectId,
        owner: Address,
        stop: Stop,
        backpressure: u32,
    ) -> Self {
        let window = match backpressure as usize {
            0 => IN_FLIGHT,
            n => n.min(IN_FLIGHT),
        };
        let sink = Rc::new(ItemSink {
            sender,
            generator,
            owner,
            stop,
            sent: std::cell::Cell::new(0),
            used: std::cell::Cell::new(false),
            in_flight: RefCell::new(std::collections::VecDeque::new()),
            window,
        });
        SINK.with(|s| *s.borrow_mut() = Some(sink.clone()));
        SinkGuard(sink)
    }

    /// Whether the call's function streamed its values.
    pub(crate) fn used(&self) -> bool {
        self.0.used.get()
    }

    /// The values sent and not answered yet, for the call's end to wait on.
    pub(crate) fn take_in_flight(&self) -> Vec<ItemAck> {
        self.0.in_flight.borrow_mut().drain(..).collect()
    }
}

impl Drop for SinkGuard {
    fn drop(&mut self) {
        SINK.with(|s| s.borrow_mut().take());
    }
}

/// Sends every value of `items` to the caller of the streaming call
/// running on this thread, in order; the call's result is the
/// number of values. The first `Err` (an item's own, or a failed send)
/// ends the call with it; a cancel ends it before the next value.
pub(crate) fn emit_all(mut items: impl Iterator<Item = CallResult>) -> CallResult {
    let Some(sink) = SINK.with(|s| s.borrow().clone()) else {
        let reason = "this function streams its values (num_returns = \"streaming\") but its \
                      caller expects one value: build the caller and the workers from the same code";
        return Err(CallError::Runtime(Error::invalid("num_returns", reason)));
    };
    sink.used.set(true);
    loop {
        // Answers that came in already: a closed stream (its generator
        // was dropped) or a refused value ends the call now, not values
        // later.
        loop {
            let answered = sink
                .sender
                .settle_answered(&mut sink.in_flight.borrow_mut());
            match answered {
                None => break,
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(CallError::Runtime(e)),
            }
        }
        // Checked before the function is asked for its next value.
        if (sink.stop)() {
            return Err(CallError::Runtime(Error::TaskCancelled {
                function: String::new(),
                how: String::new(),
            }));
        }
        let Some(item) = items.next() else {
            break;
        };
        let encoded = item?;
        let index = sink.sent.get();
        let ack = sink
            .sender
            .send_item(sink.generator, index, &sink.owner, encoded)
            .map_err(CallError::Runtime)?;
        sink.sent.set(index + 1);
        let oldest = {
            let mut in_flight = sink.in_flight.borrow_mut();
            in_flight.push_back(ack);
            (in_flight.len() > sink.window).then(|| in_flight.pop_front())
        };
        if let Some(oldest) = oldest.flatten() {
            sink.sender
                .settle_items(vec![oldest])
                .map_err(CallError::Runtime)?;
        }
    }
    crate::codec::encode_owned(sink.sent.get()).map_err(CallError::Runtime)
}

/// The answer to a streaming call's value whose generator was dropped:
/// the executor ends the call, cancelled, instead of making more.
pub(crate) fn stream_closed() -> Error {
    Error::TaskCancelled {
        function: String::new(),
        how: String::new(),
    }
}
