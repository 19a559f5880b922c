//! The Tuner on a real cluster: trials run as Trainers on worker
//! processes, two at once on two CPUs, and are compared by their metric.

use prism_tests::{must, must_fail, ClusterSpec};
use prism_tune::{grid, Asha, Mode, SearchSpace, TuneConfig, Tuner};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Params {
    x: f64,
    steps: u32,
}

/// Scores best at x = 0.3; "diverges" at x above 0.8.
fn objective(p: Params) -> Result<(), String> {
    if p.x > 0.8 {
        return Err(format!("diverged at x = {}", p.x));
    }
    for step in 0..p.steps {
        let score = -(p.x - 0.3).powi(2) - 0.01 / f64::from(step + 1);
        prism_train::report(serde_json::json!({ "score": score, "step": step }), None)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A fresh folder for one test's experiments.
fn experiment_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("prism-tune-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn trials_run_as_trainers_and_the_best_config_wins() {
    ClusterSpec::new().cpus(2).start();
    let storage = experiment_dir("search");
    let space = SearchSpace::new()
        .set("x", grid([0.1, 0.3, 0.6, 0.9]))
        .set("steps", 3);
    let results = must(
        Tuner::new(objective, space)
            .tune_config(TuneConfig::new().metric("score").mode(Mode::Max))
            .run_config(prism_train::RunConfig::new("search").storage_path(&storage))
            .fit(),
        "a search over a valid space must run",
    );
    assert_eq!(results.len(), 4, "one trial per grid value");
    let best = must(results.get_best_result(), "the best trial must be found");
    assert_eq!(best.config["x"], 0.3, "x = 0.3 scores best");
    assert_eq!(best.metrics_history.len(), 3, "every report is kept");
    let errors = results.errors();
    assert_eq!(errors.len(), 1, "only x = 0.9 fails");
    let message = errors[0].error.as_deref().unwrap_or_default();
    assert!(message.contains("diverged at x = 0.9"), "{message}");
    assert_eq!(errors[0].config["x"], 0.9);
    // Each trial keeps the Trainer's folder; the experiment has a table.
    assert!(
        best.path.join("result.json").is_file(),
        "{}",
        best.path.display()
    );
    let table = must(
        std::fs::read_to_string(results.path().join("results.csv")),
        "the experiment must write results.csv",
    );
    assert_eq!(
        table.lines().count(),
        5,
        "a header and four trials:\n{table}"
    );
    assert!(
        table.lines().next().unwrap_or_default().contains("score"),
        "{table}"
    );
    let lowest = must(
        results.get_best_result_by("score", Mode::Min),
        "the worst trial by score must be found",
    );
    assert_eq!(lowest.config["x"], 0.6);
    let _ = std::fs::remove_dir_all(&storage);
}

#[test]
fn a_config_that_does_not_fit_the_function_fails_its_trial_by_name() {
    ClusterSpec::new().cpus(2).start();
    let storage = experiment_dir("badtype");
    let space = SearchSpace::new()
        .set("x", grid([0.2]))
        .set("steps", "three");
    let results = must(
        Tuner::new(objective, space)
            .run_config(prism_train::RunConfig::new("badtype").storage_path(&storage))
            .fit(),
        "the experiment runs even when a trial cannot",
    );
    let error = results.trials()[0].error.clone().unwrap_or_default();
    assert!(error.contains("steps") || error.contains("u32"), "{error}");
    let missing = results.get_best_result().unwrap_err().to_string();
    assert!(missing.contains("no metric was set"), "{missing}");
    let _ = std::fs::remove_dir_all(&storage);
}

#[test]
fn asha_stops_trials_that_fall_behind_and_stop_at_ends_every_trial() {
    ClusterSpec::new().cpus(2).start();
    let storage = experiment_dir("asha");
    // One trial at a time, the best first: the later ones meet its score
    // at the first rung and fall behind it.
    let space = SearchSpace::new()
        .set("x", grid([0.3, 0.1, 0.6]))
        .set("steps", 8);
    let results = must(
        Tuner::new(objective, space)
            .tune_config(
                TuneConfig::new()
                    .metric("score")
                    .mode(Mode::Max)
                    .max_concurrent_trials(1)
                    .scheduler(Asha::new().max_t(8).grace_period(1).reduction_factor(2.0)),
            )
            .run_config(prism_train::RunConfig::new("asha").storage_path(&storage))
            .fit(),
        "a search with ASHA must run",
    );
    let reports: Vec<usize> = results
        .trials()
        .iter()
        .map(|t| t.metrics_history.len())
        .collect();
    assert_eq!(
        reports,
        vec![8, 1, 1],
        "the leader runs to max_t, the others stop at rung 1"
    );
    assert!(results.trials()[1].stopped_early && results.trials()[2].stopped_early);
    assert!(
        !results.trials()[0].stopped_early,
        "the leader reached max_t: complete, not stopped early"
    );
    assert!(
        results.errors().is_empty(),
        "a stopped trial is not a failed one"
    );
    assert_eq!(
        must(results.get_best_result(), "a best trial").config["x"],
        0.3
    );

    let stopped = must(
        Tuner::new(
            objective,
            SearchSpace::new()
                .set("x", grid([0.2, 0.4]))
                .set("steps", 8),
        )
        .tune_config(TuneConfig::new().stop_at("training_iteration", 3.0))
        .run_config(prism_train::RunConfig::new("stop_at").storage_path(&storage))
        .fit(),
        "a search with a stop condition must run",
    );
    for trial in stopped.trials() {
        assert_eq!(
            trial.metrics_history.len(),
            3,
            "{} stops at iteration 3",
            trial.name
        );
        assert!(
            !trial.stopped_early,
            "a trial that met its stop condition is complete"
        );
    }
    let _ = std::fs::remove_dir_all(&storage);
}

#[test]
fn settings_that_cannot_work_fail_before_any_trial_starts() {
    ClusterSpec::new().cpus(2).start();
    let storage = experiment_dir("bad");
    let space = || SearchSpace::new().set("x", grid([0.1])).set("steps", 1);
    let run = || prism_train::RunConfig::new("bad").storage_path(&storage);
    let cases: Vec<(Tuner, &str)> = vec![
        (
            Tuner::new(objective, space()).tune_config(TuneConfig::new().metric("score")),
            "without a mode",
        ),
        (
            Tuner::new(objective, space()).tune_config(TuneConfig::new().mode(Mode::Min)),
            "without a metric",
        ),
        (Tuner::new(objective, SearchSpace::new()), "empty"),
        (
            Tuner::new(objective, space()).scaling_config(prism_train::ScalingConfig::new(3)),
            "needs 3 CPU",
        ),
        (
            Tuner::new(objective, space()).tune_config(TuneConfig::new().scheduler(Asha::new())),
            "needs a metric",
        ),
    ];
    for (tuner, words) in cases {
        let err = must_fail(
            tuner.run_config(run()).fit(),
            "a setting that cannot work must fail",
        );
        assert!(err.to_string().contains(words), "{err}");
    }
    assert!(
        !storage.join("bad").join("trial_00000").exists(),
        "no trial may start"
    );
    let _ = std::fs::remove_dir_all(&storage);
}

#[derive(Serialize, Deserialize)]
struct DataParams {
    x: f64,
}

fn with_data(p: DataParams) -> Result<(), String> {
    let rows = prism_train::get_dataset_shard("train")
        .map_err(|e| e.to_string())?
        .count()
        .map_err(|e| e.to_string())?;
    let world = prism_train::get_context()
        .map_err(|e| e.to_string())?
        .world_size();
    let score = -(p.x - 0.3).powi(2);
    prism_train::report(
        serde_json::json!({ "score": score, "rows": rows, "world": world }),
        None,
    )
    .map_err(|e| e.to_string())
}

#[test]
fn a_configured_trainer_with_its_dataset_and_workers_is_tuned() {
    ClusterSpec::new().cpus(2).start();
    let storage = experiment_dir("trainer");
    let data = prism_train::data::Dataset::range(10);
    let results = must(
        Tuner::with_trainer(
            move |p: DataParams| {
                prism_train::Trainer::new(with_data, p)
                    .dataset("train", data.clone())
                    .scaling_config(prism_train::ScalingConfig::new(2))
            },
            SearchSpace::new().set("x", grid([0.1, 0.3])),
        )
        .tune_config(TuneConfig::new().metric("score").mode(Mode::Max))
        .run_config(prism_train::RunConfig::new("trainer").storage_path(&storage))
        .fit(),
        "a search over a configured Trainer must run",
    );
    assert!(results.errors().is_empty(), "{:?}", results.errors());
    for trial in results.trials() {
        let m = trial.metrics.clone().unwrap_or_default();
        assert_eq!(m["world"], 2, "each trial runs the Trainer's two workers");
        assert_eq!(
            m["rows"], 5,
            "each worker gets half of the Trainer's dataset"
        );
    }
    assert_eq!(
        must(results.get_best_result(), "a best trial").config["x"],
        0.3
    );
    let _ = std::fs::remove_dir_all(&storage);
}
