//! A job's environment variables (Ray's `runtime_env={"env_vars": ...}`
//! of `ray.init`): every worker and actor of the job has them, and a
//! malformed value is refused when `init` runs.

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
    prism::shutdown();
}
