//! Per-call options for tasks and actors.

use crate::placement::PlacementGroup;
use crate::resources::{resource_builders, Resources};
use crate::runtime::submission::SchedulingKey;
use crate::{Error, Result};
use prism_protocol::messages::{self, BundleRef, EnvVars, SchedulingStrategy};

/// The variables a node sets for each worker it starts.
const WORKER_VARIABLES: &[&str] = &[
    "PRISM_WORKER",
    "PRISM_WORKER_ID",
    "PRISM_RAYLET_SOCKET",
    "PRISM_SESSION_DIR",
    "PRISM_STORE_PATH",
    "PRISM_NODE_ID",
    "PRISM_JOB_ID",
    "PRISM_NAMESPACE",
    "PRISM_NODE_IP",
    "PRISM_AUTH_TOKEN",
];

/// A task's or an actor's runtime environment (Ray's `runtime_env` in
/// `.options(...)`): environment variables its worker process has beyond
/// its job's. A worker started with one environment serves only tasks that
/// ask for the same, as Ray's worker pool keys workers by it.
///
/// ```no_run
/// #[prism::remote]
/// fn mode() -> String {
///     std::env::var("MODE").unwrap_or_default()
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default())?;
///     let env = prism::RuntimeEnv::new().env_var("MODE", "fast");
///     let got = mode::remote_with(prism::TaskOptions::new().runtime_env(env))?;
///     assert_eq!(prism::get(&got)?, "fast");
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeEnv {
    env_vars: EnvVars,
}

impl RuntimeEnv {
    /// No variables.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets variable `name` to `value`.
    pub fn env_var(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env_vars.insert(name.into(), value.into());
        self
    }

    /// The variables, by name.
    pub fn env_vars(&self) -> &EnvVars {
        &self.env_vars
    }

    /// The variables, checked: a name must be non-empty without `=` or NUL,
    /// a value without NUL, and not one the node sets for each worker
    /// (`PRISM_WORKER`, `PRISM_NODE_ID`, ...).
    fn checked(&self) -> Result<EnvVars> {
        for (name, value) in &self.env_vars {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(Error::invalid(
                    "runtime_env",
                    format!("{name:?} is not a valid environment variable (a name without '=' or NUL, a value without NUL)"),
                ));
            }
            if WORKER_VARIABLES.contains(&name.as_str()) || name.starts_with("PRISM_TLS_") {
                return Err(Error::invalid(
                    "runtime_env",
                    format!("{name} is set by the node for each worker; choose another name"),
                ));
            }
        }
        Ok(self.env_vars.clone())
    }
}

/// Options for one task submission; start from [`TaskOptions::new`].
///
/// ```no_run
/// #[prism::remote]
/// fn train_step(epoch: u32) -> f64 {
///     epoch as f64
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default().resource("accelerator", 1.0))?;
///     let opts = prism::TaskOptions::new().num_cpus(2.0).resource("accelerator", 1.0);
///     let loss = train_step::remote_with(opts, 3)?;
///     println!("{}", prism::get(&loss)?);
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskOptions {
    resources: Resources,
    placement: Option<Result<BundleRef>>,
    strategy: SchedulingStrategy,
    /// `None`: Ray's default, 3.
    max_retries: Option<i64>,
    retry_exceptions: bool,
    /// With `retry_exceptions`: retry only errors whose message contains
    /// one of these (empty: every error).
    retry_matching: Vec<String>,
    /// For streaming tasks: values left unread before the task pauses.
    generator_backpressure: Option<u32>,
    /// Its worker's environment beyond the job's.
    runtime_env: RuntimeEnv,
}

/// Retries of a task whose worker dies, unless set (Ray's default).
const DEFAULT_MAX_RETRIES: i64 = 3;

impl TaskOptions {
    /// Defaults: one CPU.
    pub fn new() -> Self {
        Self::default()
    }

    resource_builders!(
        resources,
        "the task holds while it runs (CPUs: default 1, and 0 is allowed)"
    );

    /// Runs the task in bundle `bundle_index` of `group` (`None`: any
    /// bundle with room), drawing on the group's reservation (Ray's
    /// `PlacementGroupSchedulingStrategy`).
    pub fn placement_group(mut self, group: &PlacementGroup, bundle_index: Option<usize>) -> Self {
        self.placement = Some(group.bundle_ref(bundle_index));
        self
    }

    /// Where in a multi-node cluster the task may run: by default on the
    /// caller's node while it has room, then on the least loaded node;
    /// [`SchedulingStrategy::Spread`] over the nodes in turn;
    /// [`SchedulingStrategy::NodeAffinity`] on one node. A task in a
    /// placement group takes the group's placement instead, so setting
    /// both is an error.
    ///
    /// ```no_run
    /// # #[prism::remote] fn work() -> u32 { 1 }
    /// # fn main() -> prism::Result<()> {
    /// use prism::{SchedulingStrategy, TaskOptions};
    /// prism::init(prism::Config::default())?;
    /// let spread = TaskOptions::new().scheduling_strategy(SchedulingStrategy::Spread);
    /// let refs: Vec<_> = (0..8).map(|_| work::remote_with(spread.clone())).collect::<prism::Result<_>>()?;
    /// let node = prism::nodes()?[0].node_id.clone();
    /// let pinned = TaskOptions::new().scheduling_strategy(SchedulingStrategy::NodeAffinity {
    ///     node_id: prism::NodeId::parse(&node).expect("a node id"),
    ///     soft: false,
    /// });
    /// prism::get(&work::remote_with(pinned)?)?;
    /// # let _ = refs; Ok(()) }
    /// ```
    pub fn scheduling_strategy(mut self, strategy: SchedulingStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// How many times the task runs again if its worker process dies
    /// (default 3, as Ray; -1 for no limit, 0 for never). The caller sees
    /// only the final outcome; a final error says how many attempts were
    /// made and why each failed.
    pub fn max_retries(mut self, n: i64) -> Self {
        self.max_retries = Some(n);
        self
    }

    /// Also retries the task when the function itself fails (returns `Err`
    /// or panics), within the same `max_retries` (Ray's
    /// `retry_exceptions=True`).
    pub fn retry_exceptions(mut self, yes: bool) -> Self {
        self.retry_exceptions = yes;
        self
    }

    /// For a streaming task (`num_returns = "streaming"`): once more than
    /// `n` of its values wait unread in the caller's generator, the task
    /// pauses (holding its worker) until the caller reads (Ray's
    /// `_generator_backpressure_num_objects`). At most `2n + 1` values
    /// are stored and unread at once: `n` waiting, and `n + 1` more on
    /// their way that the task made before it paused. Unset, a task makes
    /// values as fast as it can. A caller that waits for the task's end
    /// before it reads would wait forever: read as you go (a cancel, or
    /// dropping the generator, ends a paused task). Other tasks ignore
    /// it; 0 is refused.
    ///
    /// ```no_run
    /// #[prism::remote(num_returns = "streaming")]
    /// fn frames(n: u32) -> impl Iterator<Item = Vec<u8>> {
    ///     (0..n).map(|_| vec![0u8; 1 << 20])
    /// }
    ///
    /// # fn main() -> prism::Result<()> {
    /// prism::init(prism::Config::default())?;
    /// let paced = prism::TaskOptions::new().generator_backpressure(4);
    /// for frame in frames::remote_with(paced, 1000)? {
    ///     let _bytes = prism::get(&frame?)?; // 9 MiB unread at most
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn generator_backpressure(mut self, n: u32) -> Self {
        self.generator_backpressure = Some(n);
        self
    }

    /// Runs the task in a worker with these environment variables beyond
    /// its job's (Ray's `.options(runtime_env=...)`); see [`RuntimeEnv`].
    pub fn runtime_env(mut self, env: RuntimeEnv) -> Self {
        self.runtime_env = env;
        self
    }

    /// The streaming bound, checked: 0 when unset.
    pub(crate) fn stream_backpressure(&self) -> Result<u32> {
        match self.generator_backpressure {
            Some(0) => Err(Error::invalid(
                "generator_backpressure",
                "a streaming task needs room for at least 1 unread value; leave it unset for no bound",
            )),
            Some(n) => Ok(n),
            None => Ok(0),
        }
    }

    /// Retries the function's own errors only when their message (the
    /// `Display` of the returned `Err`, or the panic message) contains one
    /// of `patterns`, within `max_retries`; turns `retry_exceptions` on. The
    /// Rust counterpart of Ray's `retry_exceptions=[SomeError, ...]`.
    pub fn retry_exceptions_matching<S: Into<String>>(
        mut self,
        patterns: impl IntoIterator<Item = S>,
    ) -> Self {
        self.retry_exceptions = true;
        self.retry_matching = patterns.into_iter().map(Into::into).collect();
        self
    }

    /// Fills in what is not set here from `defaults` (the function's
    /// attribute), as `remote_with` does: a call's options override the
    /// attribute field by field, as Ray's `.options()` does. A value equal
    /// to the default (`retry_exceptions(false)`, the default strategy)
    /// counts as unset.
    ///
    /// ```
    /// let defaults = prism::TaskOptions::new().num_gpus(1.0).max_retries(5);
    /// let call = prism::TaskOptions::new().max_retries(0).or(defaults);
    /// assert_eq!(call, prism::TaskOptions::new().max_retries(0).num_gpus(1.0));
    /// ```
    pub fn or(mut self, defaults: TaskOptions) -> Self {
        self.resources = self.resources.or(defaults.resources);
        self.placement = self.placement.or(defaults.placement);
        if self.strategy == SchedulingStrategy::Default {
            self.strategy = defaults.strategy;
        }
        self.max_retries = self.max_retries.or(defaults.max_retries);
        self.generator_backpressure = self
            .generator_backpressure
            .or(defaults.generator_backpressure);
        if !self.retry_exceptions && self.retry_matching.is_empty() {
            self.retry_exceptions = defaults.retry_exceptions;
            self.retry_matching = defaults.retry_matching;
        }
        self
    }

    /// The retry settings, checked.
    pub(crate) fn retry_policy(&self) -> Result<(i64, bool, Vec<String>)> {
        let n = check_count(
            "max_retries",
            self.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
        )?;
        if self.retry_matching.iter().any(String::is_empty) {
            return Err(Error::invalid(
                "retry_exceptions_matching",
                "an empty pattern matches every error: use retry_exceptions(true) for that",
            ));
        }
        Ok((n, self.retry_exceptions, self.retry_matching.clone()))
    }

    /// The resource shape this asks for, and from where.
    pub(crate) fn scheduling_key(&self) -> Result<SchedulingKey> {
        let bundle = self.placement.clone().transpose()?;
        if bundle.is_some() && self.strategy != SchedulingStrategy::Default {
            return Err(Error::invalid(
                "scheduling_strategy",
                "a task in a placement group runs where the group placed its bundle; \
                 set either the group or a strategy",
            ));
        }
        Ok(SchedulingKey {
            shape: self.resources.to_set(1.0)?,
            bundle,
            strategy: self.strategy,
            env_vars: self.runtime_env.checked()?,
        })
    }
}

/// How many calls an async actor left at its default `max_concurrency`
/// runs at once: 1000, Ray's default for async actors.
pub const ASYNC_ACTOR_CONCURRENCY: u32 = 1000;

/// Options for creating an actor; start from [`ActorOptions::new`].
///
/// ```no_run
/// #[prism::actor]
/// struct Cache {
///     hits: u64,
/// }
///
/// #[prism::actor]
/// impl Cache {
///     fn new() -> Self {
///         Cache { hits: 0 }
///     }
///     fn hit(&mut self) -> u64 {
///         self.hits += 1;
///         self.hits
///     }
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default())?;
///     let opts = prism::ActorOptions::new().name("cache").max_concurrency(4);
///     let cache = Cache::remote_with(opts)?;
///     let same: prism::ActorHandle<Cache> = prism::get_actor("cache")?;
///     assert_eq!(same.id(), cache.id());
///     println!("{}", prism::get(&cache.hit()?)?);
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ActorOptions {
    name: Option<String>,
    namespace: Option<String>,
    /// `None`: 1, or [`ASYNC_ACTOR_CONCURRENCY`] for an actor with async
    /// methods and no checkpoints.
    max_concurrency: Option<u32>,
    resources: Resources,
    placement: Option<Result<BundleRef>>,
    strategy: SchedulingStrategy,
    /// `None`: 0, as Ray.
    max_restarts: Option<i64>,
    /// `None`: 0, as Ray.
    max_task_retries: Option<i64>,
    detached: bool,
    get_if_exists: bool,
    checkpoint_every: Option<u32>,
    checkpoint_interval: Option<std::time::Duration>,
    runtime_env: RuntimeEnv,
}

impl Default for ActorOptions {
    fn default() -> Self {
        ActorOptions {
            name: None,
            namespace: None,
            max_concurrency: None,
            resources: Resources::default(),
            placement: None,
            strategy: SchedulingStrategy::Default,
            max_restarts: None,
            max_task_retries: None,
            detached: false,
            get_if_exists: false,
            checkpoint_every: None,
            checkpoint_interval: None,
            runtime_env: RuntimeEnv::default(),
        }
    }
}

/// Checks a retry or restart count: -1 (no limit) or more.
fn check_count(setting: &str, n: i64) -> Result<i64> {
    if n < -1 {
        return Err(Error::invalid(
            setting,
            format!("{n}: give -1 (no limit), 0 (never) or a positive count"),
        ));
    }
    Ok(n)
}

impl ActorOptions {
    /// Defaults: unnamed, one call at a time, no resources held.
    pub fn new() -> Self {
        Self::default()
    }

    /// A name, unique in the namespace, to find it with [`get_actor`](crate::get_actor).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The namespace of the name (default: the driver's `Config::namespace`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Where in a multi-node cluster the actor is placed (default: the
    /// creator's node while it has the actor's resources free, else the
    /// least loaded node that has), as for tasks
    /// ([`TaskOptions::scheduling_strategy`](crate::TaskOptions::scheduling_strategy)).
    /// On one node every strategy that names no other node places it there.
    ///
    /// ```
    /// # #[prism::actor] struct Counter {}
    /// # #[prism::actor] impl Counter { fn new() -> Self { Counter {} } }
    /// # fn main() -> prism::Result<()> {
    /// use prism::{ActorOptions, SchedulingStrategy};
    /// prism::init(prism::Config::default())?;
    /// let spread = ActorOptions::new().scheduling_strategy(SchedulingStrategy::Spread);
    /// let counters = (0..2)
    ///     .map(|_| Counter::remote_with(spread.clone()))
    ///     .collect::<prism::Result<Vec<_>>>()?;
    /// # drop(counters); Ok(()) }
    /// ```
    pub fn scheduling_strategy(mut self, strategy: SchedulingStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// How many calls may run at once.
    ///
    /// Left unset, an actor with `async` methods (and no checkpoints) is
    /// an *async actor*, as in Ray: its calls start one at a time in
    /// arrival order, a synchronous one runs to its end before the next
    /// starts, and async ones run on together while they await, up to
    /// [`ASYNC_ACTOR_CONCURRENCY`] at once. Other actors run one call at a
    /// time, in order.
    ///
    /// Given `n` above 1, up to `n` calls run at once, each started as it
    /// arrives: synchronous ones on up to `n` threads of the actor (Ray's
    /// threaded actors), async ones as tasks under `n` permits. This skips
    /// the async actor's in-order taker, which costs a sync round trip
    /// about a tenth; calls are then not started strictly in arrival
    /// order. `1` runs one call at a time, to its end.
    pub fn max_concurrency(mut self, n: u32) -> Self {
        self.max_concurrency = Some(n);
        self
    }

    resource_builders!(resources, "held for the actor's lifetime (CPUs: default 0)");

    /// Places the actor in bundle `bundle_index` of `group` (`None`: any
    /// bundle with room); its resources come from the group's reservation.
    pub fn placement_group(mut self, group: &PlacementGroup, bundle_index: Option<usize>) -> Self {
        self.placement = Some(group.bundle_ref(bundle_index));
        self
    }

    /// How many times the actor is restarted when its process dies (default
    /// 0, as Ray; -1 for no limit). A restart runs the constructor again,
    /// with the original arguments, in a new process; calls sent meanwhile
    /// wait for it. State kept in the old process is lost.
    pub fn max_restarts(mut self, n: i64) -> Self {
        self.max_restarts = Some(n);
        self
    }

    /// How many times a call that was running when the actor's process
    /// died is sent again to the restarted actor (default 0, as Ray; -1 for
    /// no limit). A call not sent again fails with
    /// [`Error::ActorUnavailable`](crate::Error::ActorUnavailable). Only
    /// useful with [`max_restarts`](Self::max_restarts).
    pub fn max_task_retries(mut self, n: i64) -> Self {
        self.max_task_retries = Some(n);
        self
    }

    /// Lets the actor outlive the driver that created it (Ray's
    /// `lifetime="detached"`): it lives until it is killed, ends itself, or
    /// the cluster stops, and another driver finds it by name. An actor
    /// that is not detached ends with the process that created it, and, if
    /// it has no name, with its last handle (see
    /// [`ActorHandle`](crate::ActorHandle)).
    ///
    /// Constructor arguments passed as object references are owned by
    /// the creating driver; a detached actor restarted after that driver
    /// left cannot fetch them, so pass a restartable detached actor its
    /// arguments by value.
    pub fn detached(mut self) -> Self {
        self.detached = true;
        self
    }

    /// The actor's process runs with these environment variables beyond
    /// its job's (Ray's `.options(runtime_env=...)`).
    pub fn runtime_env(mut self, env: RuntimeEnv) -> Self {
        self.runtime_env = env;
        self
    }

    /// With a [`name`](Self::name): if an actor of that name already
    /// exists in the namespace, `remote_with` returns a handle to it
    /// instead of failing with [`Error::ActorNameTaken`] (Ray's
    /// `get_if_exists=True`). The existing actor keeps its own options and
    /// constructor arguments; one of another class is
    /// [`Error::ActorClassMismatch`].
    ///
    /// ```no_run
    /// #[prism::actor]
    /// struct Registry;
    ///
    /// #[prism::actor]
    /// impl Registry {
    ///     fn new() -> Self {
    ///         Registry
    ///     }
    /// }
    ///
    /// fn main() -> prism::Result<()> {
    ///     prism::init(prism::Config::default())?;
    ///     let opts = prism::ActorOptions::new().name("registry").get_if_exists(true);
    ///     let first = Registry::remote_with(opts.clone())?;
    ///     let again = Registry::remote_with(opts)?;
    ///     assert_eq!(first.id(), again.id());
    ///     Ok(())
    /// }
    /// ```
    pub fn get_if_exists(mut self, yes: bool) -> Self {
        self.get_if_exists = yes;
        self
    }

    /// Whether an existing actor of the name is wanted rather than an
    /// error (see [`get_if_exists`](Self::get_if_exists)).
    pub(crate) fn wants_existing(&self) -> bool {
        self.get_if_exists
    }

    /// Saves the actor's state after every `n` calls, so that a restart
    /// resumes from it instead of running the constructor (the struct must
    /// be `#[prism::actor(checkpoint)]`). See
    /// [`checkpoint_actor`](crate::checkpoint_actor) for what a restart
    /// keeps and loses.
    pub fn checkpoint_every(mut self, n: u32) -> Self {
        self.checkpoint_every = Some(n);
        self
    }

    /// Saves the actor's state after a call once `interval` has passed
    /// since the last save (as [`checkpoint_every`](Self::checkpoint_every)).
    pub fn checkpoint_interval(mut self, interval: std::time::Duration) -> Self {
        self.checkpoint_interval = Some(interval);
        self
    }

    /// Fills in fields not set here from `defaults` (the struct's attribute).
    pub fn or(mut self, defaults: ActorOptions) -> Self {
        self.name = self.name.or(defaults.name);
        self.namespace = self.namespace.or(defaults.namespace);
        self.placement = self.placement.or(defaults.placement);
        self.max_restarts = self.max_restarts.or(defaults.max_restarts);
        self.max_task_retries = self.max_task_retries.or(defaults.max_task_retries);
        self.detached |= defaults.detached;
        self.get_if_exists |= defaults.get_if_exists;
        self.checkpoint_every = self.checkpoint_every.or(defaults.checkpoint_every);
        self.checkpoint_interval = self.checkpoint_interval.or(defaults.checkpoint_interval);
        self.max_concurrency = self.max_concurrency.or(defaults.max_concurrency);
        self.resources = self.resources.or(defaults.resources);
        self
    }

    /// The options as the raylet and the actor's process take them, for a
    /// class with `async_methods` or without.
    pub(crate) fn into_wire(
        self,
        default_namespace: &str,
        async_methods: bool,
    ) -> Result<messages::ActorOptions> {
        let checkpointed =
            self.checkpoint_every.is_some_and(|n| n > 0) || self.checkpoint_interval.is_some();
        // A checkpointed state is saved between two calls: such an actor
        // runs one call at a time (create_actor refuses more). A count
        // given keeps the mode where calls start as they arrive, which
        // serves a call without a hop through a taker.
        let async_actor = async_methods && !checkpointed && self.max_concurrency.is_none();
        let max_concurrency = match self.max_concurrency {
            Some(0) => return Err(Error::invalid("max_concurrency", "must be at least 1")),
            Some(n) => n,
            None if async_actor => ASYNC_ACTOR_CONCURRENCY,
            None => 1,
        };
        if let Some(name) = &self.name {
            if name.is_empty() {
                return Err(Error::invalid("actor name", "must not be empty"));
            }
        }
        if self.get_if_exists && self.name.is_none() {
            return Err(Error::invalid(
                "get_if_exists",
                "only a named actor can be found again: give ActorOptions::name too",
            ));
        }
        if self.placement.is_some() && self.strategy != SchedulingStrategy::Default {
            return Err(Error::invalid(
                "scheduling_strategy",
                "an actor in a placement group runs where the group placed its bundle; \
                 set either the group or a strategy",
            ));
        }
        let max_restarts = check_count("max_restarts", self.max_restarts.unwrap_or(0))?;
        let max_task_retries = check_count("max_task_retries", self.max_task_retries.unwrap_or(0))?;
        Ok(messages::ActorOptions {
            env_vars: self.runtime_env.checked()?,
            max_restarts,
            max_task_retries,
            detached: self.detached,
            checkpoint_every: self.checkpoint_every.unwrap_or(0),
            checkpoint_interval_ms: self
                .checkpoint_interval
                .map(|d| d.as_millis().max(1) as u64)
                .unwrap_or(0),
            name: self.name,
            namespace: self
                .namespace
                .unwrap_or_else(|| default_namespace.to_string()),
            max_concurrency,
            async_actor,
            resources: self.resources.to_set(0.0)?,
            placement: self.placement.transpose()?,
            strategy: self.strategy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_or_negative_resource_requests_are_rejected_by_name() {
        let err = TaskOptions::new()
            .num_gpus(-1.0)
            .scheduling_key()
            .unwrap_err();
        assert!(err.to_string().contains("GPU request"), "{err}");
        let err = TaskOptions::new()
            .resource("disk", 0.0)
            .scheduling_key()
            .unwrap_err();
        assert!(err.to_string().contains("disk request"), "{err}");
        assert!(
            TaskOptions::new().num_cpus(0.0).scheduling_key().is_ok(),
            "zero CPUs is a valid request"
        );
    }

    #[test]
    fn actor_options_take_defaults_only_where_unset() {
        let o = ActorOptions::new().name("a").or(ActorOptions::new()
            .name("b")
            .max_concurrency(4)
            .num_cpus(1.0));
        assert_eq!(o.name.as_deref(), Some("a"));
        assert_eq!(o.max_concurrency, Some(4));
        // An explicit 1 is not taken for unset.
        let one = ActorOptions::new()
            .max_concurrency(1)
            .or(ActorOptions::new().max_concurrency(4));
        assert_eq!(one.max_concurrency, Some(1));
        assert_eq!(o.resources.num_cpus, Some(1.0));
    }

    #[test]
    fn an_async_class_left_at_the_default_concurrency_is_an_async_actor() {
        let wire = |o: ActorOptions, async_methods: bool| {
            let w = o.into_wire("ns", async_methods).unwrap();
            (w.max_concurrency, w.async_actor)
        };
        assert_eq!(wire(ActorOptions::new(), false), (1, false));
        assert_eq!(
            wire(ActorOptions::new(), true),
            (ASYNC_ACTOR_CONCURRENCY, true)
        );
        assert_eq!(
            wire(ActorOptions::new().max_concurrency(1), true),
            (1, false)
        );
        assert_eq!(
            wire(ActorOptions::new().max_concurrency(8), true),
            (8, false)
        );
        assert_eq!(
            wire(ActorOptions::new().max_concurrency(8), false),
            (8, false)
        );
        // A checkpointed state is saved between two calls: one at a time.
        assert_eq!(
            wire(ActorOptions::new().checkpoint_every(5), true),
            (1, false)
        );
        let zero = ActorOptions::new().max_concurrency(0).into_wire("ns", true);
        assert!(zero.unwrap_err().to_string().contains("at least 1"));
    }

    #[test]
    fn restart_counts_below_minus_one_are_rejected_by_name() {
        let err = ActorOptions::new()
            .max_restarts(-2)
            .into_wire("ns", false)
            .unwrap_err();
        assert!(err.to_string().contains("max_restarts"), "{err}");
        let err = ActorOptions::new()
            .max_task_retries(-5)
            .into_wire("ns", false)
            .unwrap_err();
        assert!(err.to_string().contains("max_task_retries"), "{err}");
        let wire = ActorOptions::new()
            .max_restarts(-1)
            .or(ActorOptions::new().max_restarts(2).max_task_retries(3))
            .into_wire("ns", false)
            .unwrap();
        assert_eq!((wire.max_restarts, wire.max_task_retries), (-1, 3));
    }
}
