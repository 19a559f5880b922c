//! [`Backoff`]: the pauses between the tries of something that may
//! succeed later (a peer not listening yet, a record not written yet, a
//! node not yet out of the view), one helper for every retry loop.

use std::time::{Duration, Instant};

/// Pauses that start at `first` and double to `most`, cut short by a
/// deadline when there is one.
///
/// ```
/// use prism_config::Backoff;
/// use std::time::{Duration, Instant};
///
/// let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(40));
/// let pauses: Vec<_> = (0..4).map(|_| backoff.next_pause().unwrap()).collect();
/// assert_eq!(pauses, [10, 20, 40, 40].map(Duration::from_millis));
/// backoff.reset();
/// assert_eq!(backoff.next_pause(), Some(Duration::from_millis(10)));
///
/// // With a deadline, no pause runs past it, and none is given after it.
/// let mut bounded = Backoff::new(Duration::from_secs(5), Duration::from_secs(5))
///     .until(Instant::now() + Duration::from_millis(50));
/// assert!(bounded.next_pause().unwrap() <= Duration::from_millis(50));
/// std::thread::sleep(Duration::from_millis(60));
/// assert_eq!(bounded.next_pause(), None);
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    most: Duration,
    next: Duration,
    deadline: Option<Instant>,
}

impl Backoff {
    /// Pauses from `first`, doubling to `most`, with no deadline.
    pub fn new(first: Duration, most: Duration) -> Self {
        Backoff {
            first,
            most: most.max(first),
            next: first,
            deadline: None,
        }
    }

    /// The same pauses, none running past `deadline`.
    pub fn until(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The time left before the deadline (`Duration::MAX` without one).
    pub fn remaining(&self) -> Duration {
        self.deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }

    /// The pause before the next try, and the one after it doubled; `None`
    /// once the deadline has passed (give up).
    pub fn next_pause(&mut self) -> Option<Duration> {
        let left = self.remaining();
        if left.is_zero() {
            return None;
        }
        let pause = self.next.min(left);
        self.next = (self.next * 2).min(self.most);
        Some(pause)
    }

    /// Whether a full next pause still ends before the deadline (always
    /// true without one): for a loop that gives up rather than try once
    /// more right at its deadline.
    pub fn fits(&self) -> bool {
        self.deadline.is_none_or(|d| Instant::now() + self.next < d)
    }

    /// Sleeps this thread for the next pause; false (at once) once the
    /// deadline has passed.
    pub fn sleep(&mut self) -> bool {
        match self.next_pause() {
            Some(pause) => {
                std::thread::sleep(pause);
                true
            }
            None => false,
        }
    }

    /// A try succeeded: the next pause is `first` again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_to_the_most_and_stop_at_the_deadline() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(1), ms(5));
        let pauses: Vec<_> = (0..5).map(|_| backoff.next_pause()).collect();
        assert_eq!(
            pauses,
            [1, 2, 4, 5, 5].map(|p| Some(ms(p))).to_vec(),
            "doubling, capped"
        );
        let mut past = Backoff::new(ms(1), ms(5)).until(Instant::now());
        assert_eq!(past.next_pause(), None);
        assert!(!past.sleep());
        assert!(!past.fits());
        let later = Backoff::new(ms(1), ms(5)).until(Instant::now() + Duration::from_secs(60));
        assert!(later.fits());
        assert!(later.remaining() > Duration::from_secs(59));
        // `most` below `first` is taken as `first`.
        let mut flat = Backoff::new(ms(3), ms(1));
        assert_eq!(flat.next_pause(), Some(ms(3)));
        assert_eq!(flat.next_pause(), Some(ms(3)));
    }
}
