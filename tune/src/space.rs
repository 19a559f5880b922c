//! Search spaces: what each hyperparameter may be, and the trial configs
//! they expand to.
//!
//! A [`SearchSpace`] maps names to parameters: a fixed value, a [`grid`]
//! (every value is tried), or a distribution sampled once per trial
//! ([`choice`], [`uniform`], [`quniform`], [`loguniform`], [`randint`],
//! [`randn`]). Names with dots (`"model.hidden"`) and nested spaces
//! ([`SearchSpace::nest`]) make nested configs. The trial configs are, as in
//! Ray Tune, every combination of the grids, repeated `num_samples` times,
//! with the distributions sampled afresh for each; sampling follows a seed,
//! so the same seed gives the same configs.

use crate::rng::Rng;
use crate::TuneError;
use serde_json::{Map, Value};

/// How one hyperparameter is chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// Always this value.
    Fixed(Value),
    /// Every value, one trial config each (Ray's `grid_search`).
    Grid(Vec<Value>),
    /// One of the values, uniformly at random.
    Choice(Vec<Value>),
    /// A float in `[low, high)`, uniformly.
    Uniform {
        /// Lowest value.
        low: f64,
        /// Upper bound (excluded).
        high: f64,
    },
    /// A float in `[low, high]` rounded to a multiple of `q`.
    QUniform {
        /// Lowest value.
        low: f64,
        /// Highest value.
        high: f64,
        /// The step.
        q: f64,
    },
    /// A float in `[low, high)` whose logarithm is uniform.
    LogUniform {
        /// Lowest value (above zero).
        low: f64,
        /// Upper bound (excluded).
        high: f64,
    },
    /// An integer in `[low, high)`, uniformly.
    RandInt {
        /// Lowest value.
        low: i64,
        /// Upper bound (excluded).
        high: i64,
    },
    /// A float from a normal distribution.
    RandN {
        /// The mean.
        mean: f64,
        /// The standard deviation (above zero).
        sd: f64,
    },
    /// A nested space.
    Space(SearchSpace),
}

/// Every value in `values`, one trial config each (Ray's `grid_search`).
pub fn grid<T: Into<Value>>(values: impl IntoIterator<Item = T>) -> Param {
    Param::Grid(values.into_iter().map(Into::into).collect())
}

/// One of `values`, uniformly at random.
pub fn choice<T: Into<Value>>(values: impl IntoIterator<Item = T>) -> Param {
    Param::Choice(values.into_iter().map(Into::into).collect())
}

/// A float in `[low, high)`, uniformly.
pub fn uniform(low: f64, high: f64) -> Param {
    Param::Uniform { low, high }
}

/// A float in `[low, high]`, uniformly, rounded to a multiple of `q`.
pub fn quniform(low: f64, high: f64, q: f64) -> Param {
    Param::QUniform { low, high, q }
}

/// A float in `[low, high)` whose logarithm is uniform (learning rates).
pub fn loguniform(low: f64, high: f64) -> Param {
    Param::LogUniform { low, high }
}

/// An integer in `[low, high)`, uniformly.
pub fn randint(low: i64, high: i64) -> Param {
    Param::RandInt { low, high }
}

/// A float from the normal distribution with this mean and standard
/// deviation.
pub fn randn(mean: f64, sd: f64) -> Param {
    Param::RandN { mean, sd }
}

impl<T: Into<Value>> From<T> for Param {
    fn from(value: T) -> Param {
        Param::Fixed(value.into())
    }
}

impl From<SearchSpace> for Param {
    fn from(space: SearchSpace) -> Param {
        Param::Space(space)
    }
}

/// Names to parameters; see the module docs.
///
/// ```
/// use prism_tune::{choice, grid, loguniform, SearchSpace};
///
/// let space = SearchSpace::new()
///     .set("lr", loguniform(1e-4, 1e-1))
///     .set("model.hidden", choice([64, 128, 256]))
///     .set("batch_size", grid([32, 64]))
///     .set("epochs", 3);
/// let configs = space.configs(2, 7).unwrap();
/// assert_eq!(configs.len(), 4); // 2 grid values, 2 samples each
/// assert_eq!(configs[0]["epochs"], 3);
/// assert!(configs[0]["model"]["hidden"].is_u64());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchSpace {
    params: Vec<(String, Param)>,
}

impl SearchSpace {
    /// An empty space; give it at least one parameter before searching.
    pub fn new() -> Self {
        SearchSpace::default()
    }

    /// Sets `name` (dots make nested objects), replacing an earlier setting
    /// of the same name.
    pub fn set(mut self, name: impl Into<String>, param: impl Into<Param>) -> Self {
        let name = name.into();
        let param = param.into();
        match self.params.iter_mut().find(|(n, _)| *n == name) {
            Some((_, p)) => *p = param,
            None => self.params.push((name, param)),
        }
        self
    }

    /// Sets `name` to a nested space.
    pub fn nest(self, name: impl Into<String>, space: SearchSpace) -> Self {
        self.set(name, Param::Space(space))
    }

    /// Checks every parameter, naming the first that can never be sampled.
    pub fn validate(&self) -> Result<(), TuneError> {
        for (name, param) in self.leaves("") {
            check(&name, param)?;
        }
        Ok(())
    }

    /// The trial configs: every combination of the grids, `num_samples`
    /// times, with the other parameters sampled from `seed`.
    pub fn configs(&self, num_samples: usize, seed: u64) -> Result<Vec<Value>, TuneError> {
        if num_samples == 0 {
            return Err(TuneError::InvalidConfig {
                field: "num_samples",
                reason: "must be at least 1".into(),
            });
        }
        self.validate()?;
        let leaves = self.leaves("");
        if leaves.is_empty() {
            return Err(TuneError::InvalidConfig {
                field: "search space",
                reason: "it is empty: set at least one parameter with SearchSpace::set".into(),
            });
        }
        let grids: Vec<(usize, &Vec<Value>)> = leaves
            .iter()
            .enumerate()
            .filter_map(|(i, (_, p))| match p {
                Param::Grid(values) => Some((i, values)),
                _ => None,
            })
            .collect();
        let combinations: usize = grids.iter().map(|(_, v)| v.len()).product();
        let mut rng = Rng::new(seed);
        let mut configs = Vec::with_capacity(num_samples * combinations);
        for _ in 0..num_samples {
            for combination in 0..combinations {
                // The first grid varies slowest, as Ray orders them.
                let mut picks = vec![0usize; leaves.len()];
                let mut rest = combination;
                for (i, values) in grids.iter().rev() {
                    picks[*i] = rest % values.len();
                    rest /= values.len();
                }
                let mut config = Value::Object(Map::new());
                for (i, (name, param)) in leaves.iter().enumerate() {
                    let value = match param {
                        Param::Grid(values) => values[picks[i]].clone(),
                        other => sample(other, &mut rng),
                    };
                    insert(&mut config, name, value);
                }
                configs.push(config);
            }
        }
        Ok(configs)
    }

    /// Every parameter that is not a nested space, with its full name.
    fn leaves(&self, prefix: &str) -> Vec<(String, &Param)> {
        let mut out = Vec::new();
        for (name, param) in &self.params {
            let full = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            match param {
                Param::Space(inner) => out.extend(inner.leaves(&full)),
                other => out.push((full, other)),
            }
        }
        out
    }
}

fn invalid(name: &str, reason: impl Into<String>) -> TuneError {
    TuneError::InvalidSpace {
        name: name.to_string(),
        reason: reason.into(),
    }
}

fn check(name: &str, param: &Param) -> Result<(), TuneError> {
    let finite = |x: f64| x.is_finite();
    match param {
        Param::Fixed(_) | Param::Space(_) => Ok(()),
        Param::Grid(v) | Param::Choice(v) if v.is_empty() => {
            Err(invalid(name, "has no values to choose from"))
        }
        Param::Grid(_) | Param::Choice(_) => Ok(()),
        Param::Uniform { low, high } | Param::QUniform { low, high, .. }
            if !(finite(*low) && finite(*high) && low < high) =>
        {
            Err(invalid(
                name,
                format!("needs finite bounds with low < high, got {low} and {high}"),
            ))
        }
        Param::QUniform { q, .. } if !(q.is_finite() && *q > 0.0) => {
            Err(invalid(name, format!("needs a step q above 0, got {q}")))
        }
        Param::Uniform { .. } | Param::QUniform { .. } => Ok(()),
        Param::LogUniform { low, high } if !(finite(*high) && *low > 0.0 && low < high) => {
            Err(invalid(
                name,
                format!("needs 0 < low < high (a logarithm is taken), got {low} and {high}"),
            ))
        }
        Param::LogUniform { .. } => Ok(()),
        Param::RandInt { low, high } if low >= high => Err(invalid(
            name,
            format!("needs low < high (high is excluded), got {low} and {high}"),
        )),
        Param::RandInt { .. } => Ok(()),
        Param::RandN { mean, sd } if !(mean.is_finite() && sd.is_finite() && *sd > 0.0) => {
            Err(invalid(
                name,
                format!("needs a finite mean and sd > 0, got {mean} and {sd}"),
            ))
        }
        Param::RandN { .. } => Ok(()),
    }
}

fn sample(param: &Param, rng: &mut Rng) -> Value {
    match param {
        Param::Fixed(v) => v.clone(),
        Param::Grid(v) | Param::Choice(v) => v[rng.below(v.len() as u64) as usize].clone(),
        Param::Uniform { low, high } => float(low + (high - low) * rng.unit()),
        Param::QUniform { low, high, q } => {
            let x = low + (high - low) * rng.unit();
            float(((x / q).round() * q).clamp(*low, *high))
        }
        Param::LogUniform { low, high } => {
            let (a, b) = (low.ln(), high.ln());
            float((a + (b - a) * rng.unit()).exp())
        }
        Param::RandInt { low, high } => {
            let span = high.abs_diff(*low);
            Value::from(low.wrapping_add(rng.below(span) as i64))
        }
        Param::RandN { mean, sd } => float(mean + sd * rng.normal()),
        Param::Space(_) => Value::Null, // flattened into leaves before sampling
    }
}

fn float(x: f64) -> Value {
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

/// Sets `config[a][b]...` for the dotted `name`, making objects on the way.
fn insert(config: &mut Value, name: &str, value: Value) {
    let mut at = config;
    let mut parts = name.split('.').peekable();
    while let Some(part) = parts.next() {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(map) = at else {
            return;
        };
        if parts.peek().is_none() {
            map.insert(part.to_string(), value);
            return;
        }
        at = map
            .entry(part.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_multiply_and_samples_repeat_them_in_ray_order() {
        let space = SearchSpace::new()
            .set("a", grid([1, 2, 3]))
            .set("b", grid(["x", "y"]))
            .set("lr", uniform(0.0, 1.0));
        let configs = space.configs(2, 1).unwrap();
        assert_eq!(configs.len(), 12);
        let pairs: Vec<(i64, String)> = configs[..6]
            .iter()
            .map(|c| (c["a"].as_i64().unwrap(), c["b"].as_str().unwrap().into()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (1, "x".into()),
                (1, "y".into()),
                (2, "x".into()),
                (2, "y".into()),
                (3, "x".into()),
                (3, "y".into())
            ]
        );
        assert_eq!(
            configs[..6].iter().map(|c| &c["a"]).collect::<Vec<_>>(),
            configs[6..].iter().map(|c| &c["a"]).collect::<Vec<_>>()
        );
        let lrs: std::collections::BTreeSet<String> =
            configs.iter().map(|c| c["lr"].to_string()).collect();
        assert_eq!(lrs.len(), 12, "each trial samples lr afresh");
    }

    #[test]
    fn the_same_seed_gives_the_same_configs_and_another_seed_others() {
        let space = SearchSpace::new()
            .set("lr", loguniform(1e-4, 1e-1))
            .set("units", choice([64, 128, 256]))
            .set("noise", randn(0.0, 1.0));
        assert_eq!(space.configs(5, 42).unwrap(), space.configs(5, 42).unwrap());
        assert_ne!(space.configs(5, 42).unwrap(), space.configs(5, 43).unwrap());
    }

    #[test]
    fn samples_stay_within_their_domains() {
        let space = SearchSpace::new()
            .set("u", uniform(-2.0, 3.0))
            .set("q", quniform(0.0, 1.0, 0.25))
            .set("log", loguniform(1e-3, 1e2))
            .set("int", randint(-3, 4))
            .set("pick", choice(["relu", "tanh"]));
        for c in space.configs(500, 9).unwrap() {
            let u = c["u"].as_f64().unwrap();
            assert!((-2.0..3.0).contains(&u), "{u}");
            let q = c["q"].as_f64().unwrap();
            assert!((q / 0.25 - (q / 0.25).round()).abs() < 1e-9 && (0.0..=1.0).contains(&q));
            let l = c["log"].as_f64().unwrap();
            assert!((1e-3..1e2).contains(&l), "{l}");
            let i = c["int"].as_i64().unwrap();
            assert!((-3..4).contains(&i), "{i}");
            assert!(["relu", "tanh"].contains(&c["pick"].as_str().unwrap()));
        }
        // A log-uniform spreads over decades: about as many below 1 as above.
        let below = space
            .configs(1000, 3)
            .unwrap()
            .iter()
            .filter(|c| c["log"].as_f64().unwrap() < 1.0)
            .count();
        assert!(
            (500..700).contains(&below),
            "{below} of 1000 below 1 (expect 600)"
        );
    }

    #[test]
    fn dotted_names_and_nested_spaces_make_nested_configs() {
        let space = SearchSpace::new()
            .set("model.hidden", grid([64, 128]))
            .set("model.act", "relu")
            .nest(
                "optim",
                SearchSpace::new().set("lr", 0.1).set("beta", grid([0.9])),
            );
        let configs = space.configs(1, 0).unwrap();
        assert_eq!(configs.len(), 2);
        assert_eq!(configs[1]["model"]["hidden"], 128);
        assert_eq!(configs[1]["model"]["act"], "relu");
        assert_eq!(configs[1]["optim"]["lr"], 0.1);
        assert_eq!(configs[1]["optim"]["beta"], 0.9);
    }

    #[test]
    fn a_parameter_that_can_never_be_sampled_is_named() {
        let cases = [
            (uniform(1.0, 1.0), "low < high"),
            (loguniform(0.0, 1.0), "0 < low"),
            (quniform(0.0, 1.0, 0.0), "step q"),
            (randint(5, 5), "high is excluded"),
            (randn(0.0, -1.0), "sd > 0"),
            (choice(Vec::<i32>::new()), "no values"),
            (grid(Vec::<i32>::new()), "no values"),
        ];
        for (param, words) in cases {
            let err = SearchSpace::new()
                .set("x.y", param)
                .configs(1, 0)
                .unwrap_err();
            let text = err.to_string();
            assert!(text.contains("x.y") && text.contains(words), "{text}");
        }
        let err = SearchSpace::new().set("a", 1).configs(0, 0).unwrap_err();
        assert!(err.to_string().contains("num_samples"), "{err}");
        let err = SearchSpace::new().configs(1, 0).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
