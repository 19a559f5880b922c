//! The references of a streaming call's values, as they are made.

use crate::runtime::streams::Stream;
use crate::runtime::{current, Objects};
use crate::{Error, ObjectRef, Result};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The values of a streaming call (`num_returns = "streaming"`, Ray's
/// `ObjectRefGenerator`), one [`ObjectRef`] per value, in the order the
/// function made them, each available as soon as it was made: the caller
/// reads the first values while the function makes the next.
///
/// It is an [`Iterator`] whose `next` waits for the next value (or the
/// call's end); [`next_async`](Self::next_async) waits without blocking a
/// thread and [`next_timeout`](Self::next_timeout) gives up after a
/// while. When the function fails (an `Err` item, an `Err` before the
/// first value, a panic, a lost worker with no retries left), the values
/// made before come first, then the error, then `None`. A call retried
/// after its worker died runs again from its first value; the generator
/// hands out each value once (a retry is assumed to make the same values
/// as the run before). Dropping the generator ends the call too: its
/// executor makes no further value once the answer to a value it sent
/// says the generator is gone (values in flight then are freed).
///
/// Each value is an object of its own, owned by the caller, freed when
/// its last reference goes; values not taken yet are freed with the
/// generator. A value whose only copy is lost with its node is not made
/// again: its `get` fails with [`Error::ObjectLost`].
///
/// ```no_run
/// #[prism::remote(num_returns = "streaming")]
/// fn squares(n: u64) -> impl Iterator<Item = u64> {
///     (0..n).map(|i| i * i)
/// }
///
/// # fn main() -> prism::Result<()> {
/// prism::init(prism::Config::default())?;
/// let mut total = 0;
/// for square in squares::remote(4)? {
///     total += prism::get(&square?)?;
/// }
/// assert_eq!(total, 14);
/// prism::shutdown();
/// # Ok(())
/// # }
/// ```
pub struct ObjectRefGenerator<T> {
    /// `None` once the generator ended.
    cursor: Option<Cursor>,
    completed: ObjectRef<u64>,
    /// Closes the stream when the generator ends or is dropped.
    open: OpenStream,
    _type: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for ObjectRefGenerator<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectRefGenerator")
            .field("call", &self.completed.id())
            .field("next", &self.cursor.as_ref().map(|c| c.index))
            .finish()
    }
}

/// A stream open in this process's `Streams` while its generator lives.
struct OpenStream {
    id: prism_protocol::ids::ObjectId,
    objects: Weak<Objects>,
}

impl OpenStream {
    fn close(&mut self) {
        if let Some(objects) = std::mem::take(&mut self.objects).upgrade() {
            objects.streams.close(self.id);
        }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.close();
    }
}

type Completion = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// Where a generator stands; moved into the wait for the next value and
/// back, so that a blocking `next` can wait on the runtime.
struct Cursor {
    stream: Arc<Stream>,
    completed: ObjectRef<u64>,
    /// The wait for the call's end, kept across values (one waiter on the
    /// call's result, however many values).
    ending: Option<Completion>,
    /// How the call ended, once it did.
    ended: Option<Result<u64>>,
    /// The next value's index.
    index: u64,
}

impl Cursor {
    /// The next value, or the call's error, or `None` at the end.
    async fn step(&mut self) -> Option<Result<ObjectRef<()>>> {
        loop {
            if let Some(item) = self.stream.take(self.index) {
                self.index += 1;
                return Some(Ok(ObjectRef::from_local(item)));
            }
            if let Some(ended) = &self.ended {
                // Every value was taken in before the call answered.
                return match ended {
                    Ok(count) if self.index >= *count => None,
                    Ok(count) => Some(Err(Error::invalid(
                        "streaming",
                        format!(
                            "value {} of {count} of the stream never arrived",
                            self.index
                        ),
                    ))),
                    Err(e) => Some(Err(e.clone())),
                };
            }
            let ending = match &mut self.ending {
                Some(ending) => ending,
                None => {
                    // Waits for the call's end without marking this
                    // process blocked in a `get` (a worker reading a stream
                    // between computations keeps its CPU); the value is
                    // read after.
                    let objects = match current() {
                        Ok(core) => core.objects.clone(),
                        Err(e) => return Some(Err(e)),
                    };
                    let id = self.completed.id();
                    self.ending.insert(Box::pin(
                        async move { objects.wait_owned(id).await.map(|_| ()) },
                    ))
                }
            };
            let stream = self.stream.clone();
            tokio::select! {
                biased;
                () = stream.arrived.notified() => {}
                _ = ending => {
                    self.ending = None;
                    self.ended = Some(crate::get_async(&self.completed).await);
                }
            }
        }
    }
}

impl<T> ObjectRefGenerator<T> {
    /// Opens the stream of a call about to be submitted, whose result is
    /// `completed`.
    /// `limit`: the call's `generator_backpressure` (0: none).
    pub(crate) fn open(completed: ObjectRef<()>, objects: &Arc<Objects>, limit: u32) -> Self {
        let id = completed.id();
        let completed: ObjectRef<u64> = completed.retype();
        let stream = objects.streams.open(id, limit);
        ObjectRefGenerator {
            cursor: Some(Cursor {
                stream,
                completed: completed.clone(),
                ending: None,
                ended: None,
                index: 0,
            }),
            completed,
            open: OpenStream {
                id,
                objects: Arc::downgrade(objects),
            },
            _type: PhantomData,
        }
    }

    /// The call's result: the number of values once it ended, or its
    /// error (Ray's `completed()`). Reading it waits for the whole call.
    pub fn completed(&self) -> &ObjectRef<u64> {
        &self.completed
    }

    /// Cancels the call, as [`crate::cancel`] does: one not started never
    /// runs; a running one makes no further value (its function is not
    /// asked for one), and with `force` a running task's worker exits.
    /// The values made before stay readable; the generator then ends
    /// with [`Error::TaskCancelled`].
    pub fn cancel(&self, force: bool) -> Result<()> {
        crate::cancel(&self.completed, force)
    }

    /// The next value's reference; `None` once the call ended and every
    /// value was taken, or after its error was given.
    pub async fn next_async(&mut self) -> Option<Result<ObjectRef<T>>> {
        let cursor = self.cursor.as_mut()?;
        let next = cursor.step().await;
        self.settle(next)
    }

    /// [`Iterator::next`] that gives up after `timeout` with
    /// [`Error::GetTimeout`]; the generator stays where it was, so the
    /// next call waits again for the same value.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Result<ObjectRef<T>>> {
        self.next_within(Some(timeout))
    }

    fn next_within(&mut self, timeout: Option<Duration>) -> Option<Result<ObjectRef<T>>> {
        // A value that arrived already needs no wait.
        if let Some(cursor) = &mut self.cursor {
            if let Some(item) = cursor.stream.take(cursor.index) {
                cursor.index += 1;
                return Some(Ok(ObjectRef::from_local(item)));
            }
        }
        let mut cursor = self.cursor.take()?;
        let core = match current() {
            Ok(core) => core,
            Err(e) => {
                self.cursor = Some(cursor);
                return Some(Err(e));
            }
        };
        let waited = core.block_on(async move {
            let next = match timeout {
                None => Some(cursor.step().await),
                Some(limit) => tokio::time::timeout(limit, cursor.step()).await.ok(),
            };
            Ok((cursor, next))
        });
        match waited {
            Ok((cursor, Some(next))) => {
                self.cursor = Some(cursor);
                self.settle(next)
            }
            Ok((cursor, None)) => {
                self.cursor = Some(cursor);
                Some(Err(Error::GetTimeout {
                    waited_ms: timeout.map_or(0, |t| t.as_millis() as u64),
                    pending: 1,
                    total: 1,
                }))
            }
            Err(e) => {
                // The wait itself failed (the runtime is going away): the
                // stream ends with that error.
                self.finish();
                Some(Err(e))
            }
        }
    }

    /// After the end, or the error, the generator gives `None`.
    fn settle(&mut self, next: Option<Result<ObjectRef<()>>>) -> Option<Result<ObjectRef<T>>> {
        match next {
            Some(Ok(item)) => Some(Ok(item.retype())),
            Some(Err(e)) => {
                self.finish();
                Some(Err(e))
            }
            None => {
                self.finish();
                None
            }
        }
    }

    fn finish(&mut self) {
        self.cursor = None;
        self.open.close();
    }
}

impl<T> Iterator for ObjectRefGenerator<T> {
    type Item = Result<ObjectRef<T>>;

    /// Waits for the next value's reference (see the type's docs).
    fn next(&mut self) -> Option<Self::Item> {
        self.next_within(None)
    }
}
