//! [`Adam`]: torch's Adam optimizer, whose state can be saved in a
//! checkpoint and loaded back.
//!
//! tch's `nn::Adam` runs libtorch's own optimizer, whose running averages
//! cannot be read from Rust: a run resumed from a checkpoint that holds the
//! model alone starts those averages from zero, and its first steps after
//! the restart are far too large (a loss that had reached 0.0006 jumped to
//! 172 in a 2,000-epoch run). This one keeps the averages as tensors of its
//! own, so a checkpoint carries them and a resumed run goes on as if it had
//! never stopped.

use super::TorchError;
use std::path::Path;
use tch::nn::VarStore;
use tch::Tensor;

/// The optimizer's file in a checkpoint folder.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The step counter's entry in that file.
const STEP: &str = "__step__";

/// Adam's settings, with torch's defaults (`torch.optim.Adam`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// The coefficient of the running average of the gradient (0.9).
    pub beta1: f64,
    /// The coefficient of the running average of its square (0.999).
    pub beta2: f64,
    /// Added to the denominator, for stability (1e-8).
    pub eps: f64,
    /// L2 penalty, added to the gradient as torch's Adam does (0).
    pub weight_decay: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Adam over the trainable variables of a [`VarStore`], step for step as
/// `torch.optim.Adam` (and tch's `nn::Adam`), with [`Adam::save`] and
/// [`Adam::load`] for checkpoints.
///
/// ```
/// use prism_train::torch::{Adam, AdamConfig};
/// use tch::nn::{self, Module};
/// use tch::{Device, Kind, Tensor};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let vs = nn::VarStore::new(Device::Cpu);
/// let model = nn::linear(vs.root() / "fc", 4, 1, Default::default());
/// let mut opt = Adam::new(&vs, 0.01, AdamConfig::default());
/// let x = Tensor::randn([8, 4], (Kind::Float, Device::Cpu));
/// let loss = model.forward(&x).pow_tensor_scalar(2).mean(Kind::Float);
/// opt.zero_grad();
/// loss.backward();
/// opt.step();
///
/// // In a checkpoint folder, beside the model; a resumed run loads both.
/// let folder = std::env::temp_dir().join(format!("adam-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&folder)?;
/// opt.save(&folder)?;
/// let mut resumed = Adam::new(&vs, 0.01, AdamConfig::default());
/// resumed.load(&folder)?;
/// assert_eq!(resumed.steps(), 1);
/// # std::fs::remove_dir_all(&folder)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Adam {
    lr: f64,
    config: AdamConfig,
    /// The trainable variables, by name (sorted), with their running
    /// averages.
    slots: Vec<Slot>,
    steps: i64,
}

#[derive(Debug)]
struct Slot {
    name: String,
    var: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

impl Adam {
    /// An optimizer of `vs`'s trainable variables (those that require a
    /// gradient now) with learning rate `lr`.
    pub fn new(vs: &VarStore, lr: f64, config: AdamConfig) -> Adam {
        let mut vars: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let slots = vars
            .into_iter()
            .map(|(name, var)| Slot {
                exp_avg: var.zeros_like(),
                exp_avg_sq: var.zeros_like(),
                name,
                var,
            })
            .collect();
        Adam {
            lr,
            config,
            slots,
            steps: 0,
        }
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// Sets the learning rate (a schedule).
    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// How many steps were taken, those before a [`Adam::load`] included.
    pub fn steps(&self) -> i64 {
        self.steps
    }

    /// Clears the variables' gradients.
    pub fn zero_grad(&mut self) {
        for slot in &mut self.slots {
            slot.var.zero_grad();
        }
    }

    /// Moves every variable that has a gradient by one Adam step.
    pub fn step(&mut self) {
        self.steps += 1;
        let AdamConfig {
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.config;
        let t = self.steps as f64;
        let bias1 = 1.0 - beta1.powf(t);
        let bias2 = 1.0 - beta2.powf(t);
        let step_size = self.lr / bias1;
        tch::no_grad(|| {
            for slot in &mut self.slots {
                let grad = slot.var.grad();
                if !grad.defined() {
                    continue;
                }
                let grad = if weight_decay != 0.0 {
                    grad + &slot.var * weight_decay
                } else {
                    grad
                };
                let _ = slot.exp_avg.g_mul_scalar_(beta1);
                let _ = slot.exp_avg.g_add_(&(&grad * (1.0 - beta1)));
                let _ = slot.exp_avg_sq.g_mul_scalar_(beta2);
                let _ = slot.exp_avg_sq.g_add_(&(&grad * &grad * (1.0 - beta2)));
                let denom = (slot.exp_avg_sq.sqrt() / bias2.sqrt()) + eps;
                let update = &slot.exp_avg / denom * step_size;
                let _ = slot.var.g_sub_(&update);
            }
        });
    }

    /// Clears the gradients, runs `loss.backward()`, and steps (tch's
    /// `Optimizer::backward_step`).
    pub fn backward_step(&mut self, loss: &Tensor) {
        self.zero_grad();
        loss.backward();
        self.step();
    }

    /// Writes the running averages and the step count to
    /// [`OPTIMIZER_FILE`] in `folder` (which must exist).
    pub fn save(&self, folder: &Path) -> Result<(), TorchError> {
        let mut named: Vec<(String, Tensor)> = Vec::with_capacity(2 * self.slots.len() + 1);
        for slot in &self.slots {
            named.push((
                format!("exp_avg.{}", slot.name),
                slot.exp_avg.shallow_clone(),
            ));
            named.push((
                format!("exp_avg_sq.{}", slot.name),
                slot.exp_avg_sq.shallow_clone(),
            ));
        }
        named.push((STEP.to_string(), Tensor::from(self.steps)));
        Tensor::write_safetensors(&named, folder.join(OPTIMIZER_FILE))?;
        Ok(())
    }

    /// Reads what [`Adam::save`] wrote in `folder`, onto this optimizer's
    /// variables, which must be the same (by name and shape).
    pub fn load(&mut self, folder: &Path) -> Result<(), TorchError> {
        let path = folder.join(OPTIMIZER_FILE);
        let read = Tensor::read_safetensors(&path)?;
        let mut by_name: std::collections::HashMap<String, Tensor> = read.into_iter().collect();
        let mismatch = |what: String| TorchError::Checkpoint {
            path: path.clone(),
            message: what,
        };
        let steps = by_name
            .remove(STEP)
            .ok_or_else(|| mismatch("it has no step count".into()))?;
        let steps = steps.int64_value(&[]);
        for slot in &mut self.slots {
            for (prefix, target) in [
                ("exp_avg", &mut slot.exp_avg),
                ("exp_avg_sq", &mut slot.exp_avg_sq),
            ] {
                let key = format!("{prefix}.{}", slot.name);
                let saved = by_name.remove(&key).ok_or_else(|| {
                    mismatch(format!(
                        "it has no {key}: the checkpoint is of another model"
                    ))
                })?;
                if saved.size() != target.size() {
                    return Err(mismatch(format!(
                        "{key} has shape {:?}, the model's variable {:?}",
                        saved.size(),
                        target.size()
                    )));
                }
                tch::no_grad(|| target.copy_(&saved));
            }
        }
        if let Some(extra) = by_name.keys().next() {
            return Err(mismatch(format!(
                "it has {extra}, which this model has no variable for: the checkpoint is of \
                 another model"
            )));
        }
        self.steps = steps;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::{self, Module, OptimizerConfig};
    use tch::{Device, Kind};

    fn model(vs: &nn::Path) -> nn::Sequential {
        nn::seq()
            .add(nn::linear(vs / "l1", 3, 8, Default::default()))
            .add_fn(|x| x.relu())
            .add(nn::linear(vs / "l2", 8, 1, Default::default()))
    }

    fn data() -> (Tensor, Tensor) {
        tch::manual_seed(7);
        let x = Tensor::randn([16, 3], (Kind::Float, Device::Cpu));
        let y = x.sum_dim_intlist(1, true, Kind::Float) * 2.0 + 1.0;
        (x, y)
    }

    fn weights(vs: &nn::VarStore) -> Vec<(String, Vec<f32>)> {
        let mut v: Vec<(String, Vec<f32>)> = vs
            .variables()
            .into_iter()
            .map(|(n, t)| {
                let flat = t.flatten(0, -1);
                (n, Vec::<f32>::try_from(&flat).unwrap_or_default())
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    fn max_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
        a.iter()
            .zip(b)
            .flat_map(|((_, x), (_, y))| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
            .fold(0.0, f32::max)
    }

    #[test]
    fn it_steps_as_torchs_adam_with_weight_decay() {
        let (x, y) = data();
        let config = AdamConfig {
            weight_decay: 0.01,
            ..AdamConfig::default()
        };
        let ours_vs = nn::VarStore::new(Device::Cpu);
        let ours_net = model(&ours_vs.root());
        // The same start, copied (the global seed is shared with the tests
        // that run beside this one).
        let mut theirs_vs = nn::VarStore::new(Device::Cpu);
        let theirs_net = model(&theirs_vs.root());
        theirs_vs.copy(&ours_vs).expect("the same variables");
        let mut ours = Adam::new(&ours_vs, 0.01, config);
        let mut theirs = nn::Adam {
            wd: 0.01,
            ..Default::default()
        }
        .build(&theirs_vs, 0.01)
        .expect("tch's Adam");
        for _ in 0..50 {
            ours.zero_grad();
            ours_net
                .forward(&x)
                .mse_loss(&y, tch::Reduction::Mean)
                .backward();
            ours.step();
            theirs.zero_grad();
            theirs_net
                .forward(&x)
                .mse_loss(&y, tch::Reduction::Mean)
                .backward();
            theirs.step();
        }
        let d = max_diff(&weights(&ours_vs), &weights(&theirs_vs));
        assert!(d < 1e-4, "the weights differ by {d} after 50 steps");
    }

    #[test]
    fn a_run_resumed_from_a_saved_state_goes_on_as_the_unbroken_run() {
        let (x, y) = data();
        let folder = std::env::temp_dir().join(format!("prism-adam-{}", std::process::id()));
        std::fs::create_dir_all(&folder).expect("a folder");
        let train = |vs: &nn::VarStore, net: &nn::Sequential, opt: &mut Adam, n: usize| {
            for _ in 0..n {
                opt.zero_grad();
                net.forward(&x)
                    .mse_loss(&y, tch::Reduction::Mean)
                    .backward();
                opt.step();
            }
            weights(vs)
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let net = model(&vs.root());
        let mut opt = Adam::new(&vs, 0.02, AdamConfig::default());
        train(&vs, &net, &mut opt, 20);
        vs.save(folder.join("model.safetensors")).expect("saved");
        opt.save(&folder).expect("saved");
        let unbroken = train(&vs, &net, &mut opt, 20);

        // A new process: the model and the optimizer come from the folder.
        let mut vs2 = nn::VarStore::new(Device::Cpu);
        let net2 = model(&vs2.root());
        vs2.load(folder.join("model.safetensors")).expect("loaded");
        let mut opt2 = Adam::new(&vs2, 0.02, AdamConfig::default());
        opt2.load(&folder).expect("loaded");
        assert_eq!(opt2.steps(), 20);
        let resumed = train(&vs2, &net2, &mut opt2, 20);
        let d = max_diff(&unbroken, &resumed);
        assert!(d < 1e-6, "the resumed run differs by {d}");

        // Without the optimizer's state the same resume goes elsewhere.
        let mut vs3 = nn::VarStore::new(Device::Cpu);
        let net3 = model(&vs3.root());
        vs3.load(folder.join("model.safetensors")).expect("loaded");
        let mut fresh = Adam::new(&vs3, 0.02, AdamConfig::default());
        let cold = train(&vs3, &net3, &mut fresh, 20);
        assert!(max_diff(&unbroken, &cold) > 1e-4);

        // Another model's state is refused, naming what is wrong.
        let other = nn::VarStore::new(Device::Cpu);
        let _ = nn::linear(other.root() / "l1", 3, 4, Default::default());
        let mut wrong = Adam::new(&other, 0.02, AdamConfig::default());
        let err = wrong.load(&folder).expect_err("another model").to_string();
        assert!(err.contains("optimizer.safetensors"), "{err}");
        let _ = std::fs::remove_dir_all(&folder);
    }
}
