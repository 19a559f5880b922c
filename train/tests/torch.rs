//! `prepare_model` and the gradient all-reduce through real processes.
//!
//! As in `collective.rs`, each multi-rank test starts this test binary again,
//! once per rank, with `PRISM_TEST_ROLE` set; in those children the
//! `rank_process` test plays the role and exits non-zero on any failed check.
//! Every wait on a child is bounded, and children still running when a test
//! ends are killed.
//!
//! Each rank builds its model from its own seed, so replicas start different;
//! each step every rank recomputes every rank's gradients locally, from the
//! same seeds, as the reference the all-reduced gradients must equal.

use prism_train::collective::{GroupOptions, ProcessGroup};
use prism_train::torch::{
    prepare_model_with, tensor_from_slice, tensor_to_vec, DdpOptions, TorchError,
};
use std::sync::Arc;
use std::time::Duration;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

// ---------------------------------------------------------------- parent side

mod common;

fn run_ranks(
    role: &str,
    world: usize,
    env: &[(&str, String)],
    limit: Duration,
) -> Vec<(usize, Option<i32>, String)> {
    let ranks: Vec<usize> = (0..world).collect();
    common::run_ranks(role, world, &ranks, env, limit)
}

fn must_all_succeed(world: usize, env: &[(&str, String)], what: &str) {
    let results = run_ranks("ddp", world, env, Duration::from_secs(120));
    for (rank, code, log) in &results {
        assert_eq!(
            *code,
            Some(0),
            "{what}: rank {rank} must exit 0; its output:\n{log}"
        );
    }
}

#[test]
fn two_replicas_start_from_rank_0_and_average_gradients_in_many_small_buckets() {
    must_all_succeed(
        2,
        &[("PRISM_TEST_BUCKET_CAP_BYTES", "1024".to_string())],
        "world 2, 1 KiB buckets",
    );
}

#[test]
fn three_replicas_over_tcp_stay_identical_through_optimizer_steps() {
    must_all_succeed(
        3,
        &[
            ("PRISM_TEST_BUCKET_CAP_BYTES", "1024".to_string()),
            ("PRISM_COLLECTIVE_TRANSPORT", "tcp".to_string()),
        ],
        "world 3 over tcp, 1 KiB buckets",
    );
}

#[test]
fn three_replicas_with_the_default_bucket_size_average_gradients() {
    must_all_succeed(3, &[], "world 3, default buckets");
}

// ------------------------------------------------------- in-process, world 1

fn group_of_one() -> Arc<ProcessGroup> {
    Arc::new(
        ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))
            .expect("a group of one needs no peers"),
    )
}

#[test]
fn a_group_of_one_keeps_gradients_and_leaves_missing_ones_missing() {
    tch::manual_seed(7);
    let mut vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs.root());
    let ddp = prepare_model_with(&mut vs, Device::Cpu, group_of_one(), DdpOptions::default())
        .expect("prepare_model on a group of one");
    let (x, y) = batch(0, 0);
    net.loss(&x, &y, false).backward();
    let before = grads(&net);
    ddp.all_reduce_gradients()
        .expect("all-reduce on a group of one");
    assert_eq!(
        grads(&net),
        before,
        "the mean over one rank is its gradient"
    );
    assert!(
        !net.extra.grad().defined() && !net.never.grad().defined(),
        "a gradient no rank has stays missing"
    );
}

#[test]
fn a_variable_of_an_unsupported_kind_is_refused_with_its_name() {
    let mut vs = nn::VarStore::new(Device::Cpu);
    let _phase = vs.root().add(
        "phase",
        Tensor::zeros([2], (Kind::ComplexFloat, Device::Cpu)),
        false,
    );
    let err = prepare_model_with(&mut vs, Device::Cpu, group_of_one(), DdpOptions::default())
        .expect_err("complex numbers are not carried");
    assert!(
        matches!(&err, TorchError::UnsupportedKind { name, .. } if name == "phase"),
        "got {err}"
    );
    assert!(err.to_string().contains("\"phase\""), "{err}");
}

#[test]
fn host_slices_round_trip_through_tensors() {
    let t = tensor_from_slice(&[1.5f64, -2.0, 3.25, 0.0, 8.0, 9.0], &[3, 2]).expect("a tensor");
    assert_eq!(t.size(), [3, 2]);
    assert_eq!(
        tensor_to_vec::<f64>(&t.transpose(0, 1)).expect("a copy"),
        [1.5, 3.25, 8.0, -2.0, 0.0, 9.0]
    );
}

// ----------------------------------------------------------------- rank side

const STEPS: usize = 3;
const BATCH: i64 = 16;

/// A small model with several variables of two float kinds, one used by
/// rank 0 only, one used by nobody, and an integer buffer that differs per
/// seed (a step counter, say) and is only broadcast.
struct Net {
    layers: Vec<nn::Linear>,
    /// Double precision, so gradients travel in two wire types.
    scale: Tensor,
    /// Only rank 0's loss uses it: the other ranks have no gradient.
    extra: Tensor,
    /// No loss uses it: no rank has a gradient.
    never: Tensor,
}

impl Net {
    fn new(root: &nn::Path) -> Net {
        let dims = [10, 32, 16, 4];
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, w)| nn::linear(root / format!("layer{i}"), w[0], w[1], Default::default()))
            .collect();
        let rank_seeded = tensor_to_vec::<f32>(&Tensor::rand([1], (Kind::Float, Device::Cpu)))
            .expect("a scalar")[0];
        let _steps = root.add(
            "steps",
            Tensor::from_slice(&[(rank_seeded * 1000.0) as i64]),
            false,
        );
        Net {
            layers,
            scale: root.add(
                "scale",
                Tensor::ones([4], (Kind::Double, Device::Cpu)),
                true,
            ),
            extra: root.randn("extra", &[4], 0.0, 1.0),
            never: root.randn("never", &[3], 0.0, 1.0),
        }
    }

    fn loss(&self, x: &Tensor, y: &Tensor, uses_extra: bool) -> Tensor {
        let mut h = x.shallow_clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h);
            if i + 1 < self.layers.len() {
                h = h.tanh();
            }
        }
        let mut out = h * self.scale.to_kind(Kind::Float);
        if uses_extra {
            out += &self.extra;
        }
        out.mse_loss(y, tch::Reduction::Mean)
    }
}

/// Rank `rank`'s data for step `step`: the same on every process.
fn batch(rank: usize, step: usize) -> (Tensor, Tensor) {
    tch::manual_seed(2000 + 100 * step as i64 + rank as i64);
    let x = Tensor::randn([BATCH, 10], (Kind::Float, Device::Cpu));
    let y = Tensor::randn([BATCH, 4], (Kind::Float, Device::Cpu));
    (x, y)
}

fn all_trainable(net: &Net) -> Vec<(&'static str, Tensor)> {
    let mut out = Vec::new();
    for (i, layer) in net.layers.iter().enumerate() {
        let names: [&'static str; 2] = match i {
            0 => ["layer0.weight", "layer0.bias"],
            1 => ["layer1.weight", "layer1.bias"],
            _ => ["layer2.weight", "layer2.bias"],
        };
        out.push((names[0], layer.ws.shallow_clone()));
        if let Some(bs) = &layer.bs {
            out.push((names[1], bs.shallow_clone()));
        }
    }
    out.push(("scale", net.scale.shallow_clone()));
    out.push(("extra", net.extra.shallow_clone()));
    out
}

fn to_f64(t: &Tensor) -> Vec<f64> {
    tensor_to_vec::<f64>(&t.to_kind(Kind::Double)).expect("a host copy")
}

fn grads(net: &Net) -> Vec<(&'static str, Vec<f64>)> {
    all_trainable(net)
        .into_iter()
        .map(|(name, t)| {
            let g = t.grad();
            let values = if g.defined() {
                to_f64(&g)
            } else {
                vec![0.0; t.numel()]
            };
            (name, values)
        })
        .collect()
}

fn params(vs: &nn::VarStore) -> Vec<(String, Vec<f64>)> {
    let mut all: Vec<(String, Vec<f64>)> = vs
        .variables()
        .into_iter()
        .map(|(name, t)| (name, to_f64(&t)))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

fn env_usize(name: &str) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("the parent sets {name}"))
}

#[test]
fn rank_process() {
    let Ok(role) = std::env::var("PRISM_TEST_ROLE") else {
        return; // Only meaningful in a child started by the tests above.
    };
    match role.as_str() {
        "ddp" => role_ddp(),
        other => panic!("unknown role {other}"),
    }
}

/// Builds a model from seed `1000 + rank`.
fn build(rank: usize) -> (nn::VarStore, Net) {
    tch::manual_seed(1000 + rank as i64);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs.root());
    (vs, net)
}

fn role_ddp() {
    let rank = env_usize("RANK");
    let world = env_usize("WORLD_SIZE");
    let port = env_usize("MASTER_PORT");
    let options = match std::env::var("PRISM_TEST_BUCKET_CAP_BYTES") {
        Ok(cap) => DdpOptions::default().with_bucket_cap_bytes(cap.parse().expect("a number")),
        Err(_) => DdpOptions::default(),
    };
    let group = Arc::new(
        ProcessGroup::join(GroupOptions::new(rank, world, format!("127.0.0.1:{port}")))
            .unwrap_or_else(|e| panic!("rank {rank} must join: {e}")),
    );

    let (mut vs, net) = build(rank);
    let (rank0_vs, _) = build(0);
    if rank != 0 {
        assert_ne!(params(&vs), params(&rank0_vs), "seeds differ per rank");
    }
    let ddp = prepare_model_with(&mut vs, Device::Cpu, group.clone(), options)
        .unwrap_or_else(|e| panic!("rank {rank}: prepare_model: {e}"));
    assert_eq!(
        params(&vs),
        params(&rank0_vs),
        "after prepare_model every variable, buffers included, must hold rank 0's value"
    );

    // The reference: the same model, set to this rank's parameters, run on
    // every rank's batch.
    let (mut reference_vs, reference) = build(0);
    let mut optimizer = nn::Sgd {
        momentum: 0.9,
        ..Default::default()
    }
    .build(&vs, 0.05)
    .expect("an optimizer");
    for step in 0..STEPS {
        reference_vs.copy(&vs).expect("same variables");
        let mut expected: Vec<(&'static str, Vec<f64>)> = Vec::new();
        let mut scale: Vec<Vec<f64>> = Vec::new();
        for r in 0..world {
            for mut t in reference_vs.trainable_variables() {
                t.zero_grad();
            }
            let (x, y) = batch(r, step);
            reference.loss(&x, &y, r == 0).backward();
            let per_rank = grads(&reference);
            if expected.is_empty() {
                expected = per_rank
                    .iter()
                    .map(|(n, g)| (*n, vec![0.0; g.len()]))
                    .collect();
                scale = per_rank.iter().map(|(_, g)| vec![0.0; g.len()]).collect();
            }
            for (i, (_, g)) in per_rank.iter().enumerate() {
                for (j, v) in g.iter().enumerate() {
                    expected[i].1[j] += v / world as f64;
                    scale[i][j] = f64::max(scale[i][j], v.abs());
                }
            }
        }

        optimizer.zero_grad();
        let (x, y) = batch(rank, step);
        net.loss(&x, &y, rank == 0).backward();
        ddp.all_reduce_gradients()
            .unwrap_or_else(|e| panic!("rank {rank} step {step}: all_reduce_gradients: {e}"));
        let got = grads(&net);
        for (i, (name, values)) in got.iter().enumerate() {
            for (j, v) in values.iter().enumerate() {
                let want = expected[i].1[j];
                let tolerance = 1e-6 * scale[i][j].max(1e-12);
                assert!(
                    (v - want).abs() <= tolerance,
                    "rank {rank} step {step}: {name}[{j}] = {v}, the mean over ranks is {want}"
                );
            }
        }
        assert!(
            net.extra.grad().defined(),
            "a gradient only rank 0 has must reach every rank"
        );
        assert!(
            !net.never.grad().defined(),
            "a gradient no rank has must stay missing"
        );
        optimizer.step();
        must_be_identical_across_ranks(&group, &vs, rank, step);
    }
    // A later broadcast from another root also reaches everybody.
    let root = world - 1;
    if rank == root {
        tch::no_grad(|| {
            let _ = net.extra.shallow_clone().fill_(42.0);
        });
    }
    ddp.broadcast_parameters(root).expect("a broadcast");
    assert_eq!(
        to_f64(&net.extra),
        [42.0; 4],
        "rank {rank} holds the root's values"
    );
}

/// Gathers every rank's parameters and requires them bit-for-bit equal.
fn must_be_identical_across_ranks(
    group: &ProcessGroup,
    vs: &nn::VarStore,
    rank: usize,
    step: usize,
) {
    let mine: Vec<f64> = params(vs).into_iter().flat_map(|(_, v)| v).collect();
    let mut all = vec![0.0; mine.len() * group.world_size()];
    group.all_gather(&mine, &mut all).expect("an all-gather");
    for (r, theirs) in all.chunks(mine.len()).enumerate() {
        assert!(
            theirs == mine.as_slice(),
            "rank {rank} step {step}: rank {r}'s parameters differ from this rank's"
        );
    }
}
