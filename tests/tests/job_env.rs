//! Environment variables of a job (Ray's `runtime_env={"env_vars": ...}`
//! of `ray.init`) and of one task or actor (of `.options(runtime_env=...)`):
//! every worker and actor of the job has the job's, a task or actor with
//! its own runs in a worker started with them, and a malformed value is
//! refused.

#[prism::remote]
fn seen(name: String) -> Option<String> {
    std::env::var(name).ok()
}

#[prism::actor]
struct Reader;

#[prism::actor]
impl Reader {
    fn new() -> Self {
        Reader
    }
    fn seen(&self, name: String) -> Option<String> {
        std::env::var(name).ok()
    }
}

#[test]
fn a_jobs_workers_and_actors_see_its_environment_variables() {
    let mut bad = prism::Config::default().num_cpus(1);
    bad.job_env_vars_json = Some("[1, 2]".into());
    let err = prism::init(bad).expect_err("a list is not a map of variables");
    assert!(
        err.to_string().contains("PRISM_JOB_ENV_VARS_JSON")
            && err.to_string().contains("JSON object"),
        "{err}"
    );

    let config = prism::Config::default()
        .num_cpus(1)
        .job_env_vars([("PRISM_TEST_MODE", "fast"), ("PRISM_TEST_EMPTY", "")]);
    prism::init(config).expect("the cluster starts");
    let task = prism::get(&seen::remote("PRISM_TEST_MODE".to_string()).unwrap()).unwrap();
    assert_eq!(task.as_deref(), Some("fast"));
    let empty = prism::get(&seen::remote("PRISM_TEST_EMPTY".to_string()).unwrap()).unwrap();
    assert_eq!(empty.as_deref(), Some(""));
    let actor = Reader::remote().expect("the actor starts");
    let in_actor = prism::get(&actor.seen("PRISM_TEST_MODE".to_string()).unwrap()).unwrap();
    assert_eq!(in_actor.as_deref(), Some("fast"));
    // The node's own variables stay the node's.
    let worker = prism::get(&seen::remote("PRISM_WORKER".to_string()).unwrap()).unwrap();
    assert_eq!(worker.as_deref(), Some("1"));

    // A task's own environment: over the job's, in a worker of its own;
    // plain tasks keep plain workers.
    let env = prism::RuntimeEnv::new()
        .env_var("PRISM_TEST_MODE", "careful")
        .env_var("PRISM_TEST_TASK", "yes");
    let opts = prism::TaskOptions::new().runtime_env(env.clone());
    for _ in 0..3 {
        let got =
            prism::get(&seen::remote_with(opts.clone(), "PRISM_TEST_MODE".to_string()).unwrap())
                .unwrap();
        assert_eq!(got.as_deref(), Some("careful"));
        let plain = prism::get(&seen::remote("PRISM_TEST_TASK".to_string()).unwrap()).unwrap();
        assert_eq!(
            plain, None,
            "a plain task never runs in the other environment's worker"
        );
    }
    let actor =
        Reader::remote_with(prism::ActorOptions::new().runtime_env(env)).expect("the actor starts");
    let in_actor = prism::get(&actor.seen("PRISM_TEST_TASK".to_string()).unwrap()).unwrap();
    assert_eq!(in_actor.as_deref(), Some("yes"));

    let bad = prism::TaskOptions::new()
        .runtime_env(prism::RuntimeEnv::new().env_var("PRISM_WORKER", "0"));
    let err =
        seen::remote_with(bad, "x".to_string()).expect_err("a worker's own variable is refused");
    assert!(err.to_string().contains("PRISM_WORKER"), "{err}");
    prism::shutdown();
}
