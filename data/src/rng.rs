//! The seeded permutations behind every shuffle: SplitMix64 driving a
//! Fisher-Yates shuffle. Small, fast, and the same on every platform and
//! release, so a seed names one order for good.

/// SplitMix64 (Steele, Lea and Flood, 2014): a 64-bit state advanced by a
/// constant and mixed; passes BigCrush and takes any seed, 0 included.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound > 0`), by Lemire's multiply-and-reject,
    /// so no value is favoured.
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(bound);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

/// A uniformly random permutation of `0..n`, the same for the same seed.
pub(crate) fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut out: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64::new(seed);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        out.swap(i, j);
    }
    out
}

/// Mixes an epoch into a seed, so that seeds `s` and `s + 1` at epochs
/// `e + 1` and `e` do not give the same order.
pub(crate) fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0xd1b5_4a32_d192_ed03));
    rng.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_permutation_and_depends_on_the_seed() {
        let a = permutation(1000, 7);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_eq!(a, permutation(1000, 7), "one seed, one order");
        assert_ne!(a, permutation(1000, 8));
        assert!(permutation(0, 1).is_empty());
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = SplitMix64::new(0);
        for bound in [1u64, 2, 3, 1000, u64::MAX] {
            for _ in 0..100 {
                assert!(rng.below(bound) < bound);
            }
        }
    }
}
