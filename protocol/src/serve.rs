//! Typed servers: a process serves a service by implementing [`Serve`]
//! for each of its requests, and the service's server trait
//! ([`RayletServer`], [`ExecutorServer`], [`OwnerServer`],
//! [`DriverServer`]) holds exactly when it serves them all. The traits are
//! declared from the message list itself, so a request added to a service
//! that its server does not serve does not compile.
//!
//! Each request is handed over with an [`Answer`] that takes only its own
//! reply type: a server cannot answer `KvGet` with anything but
//! `Result<Option<Bytes>>`.
//!
//! ```
//! use prism_protocol::messages::{Call, KvGet};
//! use prism_protocol::serve::{Answer, Serve};
//!
//! /// A server of a few raylet requests.
//! struct Table;
//!
//! impl Serve<KvGet> for Table {
//!     fn serve(&self, request: KvGet, answer: Answer<KvGet>) {
//!         // The answer's type is `Result<Option<Bytes>>`, as `KvGet` says.
//!         answer.send(Ok((request.key == "k").then(|| "v".into())));
//!     }
//! }
//!
//! fn answers<C: Call>(_: &impl Serve<C>) {}
//! answers::<KvGet>(&Table);
//! ```

use crate::error::Error;
use crate::messages::{service_list, Call, Response};
use crate::rpc::Connection;
use std::marker::PhantomData;

/// Answers one request of type `C`, now or later, with `C`'s reply type.
/// An answer dropped unsent leaves its caller waiting until the connection
/// closes: send one on every path.
pub struct Answer<C: Call> {
    conn: Connection,
    id: Option<u64>,
    call: PhantomData<fn() -> C>,
}

impl<C: Call> Answer<C> {
    /// The answer to request `id` (`None`: a notification, answered with
    /// nothing) that came on `conn`.
    pub fn new(conn: &Connection, id: Option<u64>) -> Self {
        Answer {
            conn: conn.clone(),
            id,
            call: PhantomData,
        }
    }

    /// The connection the request came on.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Whether the caller waits for an answer (it was not a notification).
    pub fn wanted(&self) -> bool {
        self.id.is_some()
    }

    /// Sends the reply, or the error the caller gets instead.
    pub fn send(self, answer: Result<C::Reply, Error>) {
        self.conn.respond(self.id, Response::from_result(answer));
    }

    /// The connection and request id, for a component that keeps answers
    /// to several kinds of request in one place and answers with a
    /// [`Response`] it builds itself.
    pub fn into_parts(self) -> (Connection, Option<u64>) {
        (self.conn, self.id)
    }
}

impl<C: Call> std::fmt::Debug for Answer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("request", &C::NAME)
            .field("id", &self.id)
            .field("peer", &self.conn.peer())
            .finish()
    }
}

/// Serves requests of type `C`.
pub trait Serve<C: Call> {
    /// Serves `request`; `answer` is sent now or later (spawn what waits:
    /// this runs on the connection's reader, in arrival order).
    fn serve(&self, request: C, answer: Answer<C>);
}

/// Declares, for each service of the message list, the trait of a type
/// that serves all its requests, and the dispatch from the service's
/// request enum to it.
macro_rules! servers {
    ($(
        $(#[$service_doc:meta])*
        $variant:ident: $service:ident, $server:ident {$(
            $(#[$doc:meta])*
            $name:ident { $($(#[$field_doc:meta])* $field:ident: $ty:ty),* $(,)? } => $reply:ty $(, $bound:ident)?;
        )*}
    )*) => {$(
        #[doc = concat!(
            "A server of every request of [`", stringify!($service), "`]",
            "(crate::messages::", stringify!($service), "): implemented by ",
            "every type that implements [`Serve`] for each of them."
        )]
        pub trait $server: $(Serve<crate::messages::$name> +)* {}

        impl<T: $(Serve<crate::messages::$name> +)* ?Sized> $server for T {}

        impl crate::messages::$service {
            /// Hands the request to `server` with the answer it owes
            /// (request `id` on `conn`; `None` for a notification).
            pub fn dispatch<S: $server + ?Sized>(self, server: &S, conn: &Connection, id: Option<u64>) {
                match self {
                    $(crate::messages::$service::$name(request) => {
                        Serve::<crate::messages::$name>::serve(server, request, Answer::new(conn, id))
                    })*
                }
            }
        }
    )*};
}

service_list!(servers);
