//! The first step's time reported apart from the training speed: on a GPU the first step
//! compiles every kernel and, with burn's `autotune`, times the candidates of each tunable one
//! (seconds), which the steps after it do not repeat; a second run with the kernel cache
//! (`ddp_core::kernel_cache`) does not repeat it either.

use std::time::{Duration, Instant};

/// Times the first step and the steps after it. Call [`StepClock::step`] after each training
/// step, once its result has been read (the loss), so that the GPU's work is counted.
#[derive(Debug)]
pub struct StepClock {
    last: Instant,
    first: Option<Duration>,
    rest: Duration,
    rest_steps: usize,
}

impl Default for StepClock {
    fn default() -> Self {
        StepClock::new()
    }
}

impl StepClock {
    /// Starts timing the first step now.
    pub fn new() -> StepClock {
        StepClock {
            last: Instant::now(),
            first: None,
            rest: Duration::ZERO,
            rest_steps: 0,
        }
    }

    /// One training step has finished.
    pub fn step(&mut self) {
        self.step_at(Instant::now());
    }

    fn step_at(&mut self, now: Instant) {
        let took = now.saturating_duration_since(self.last);
        self.last = now;
        if self.first.is_none() {
            self.first = Some(took);
        } else {
            self.rest += took;
            self.rest_steps += 1;
        }
    }

    /// Restarts the clock without counting the time since the last step (an evaluation or a
    /// checkpoint in between is not a training step).
    pub fn pause_until_now(&mut self) {
        self.last = Instant::now();
    }

    /// The first step's time, if a step ran.
    pub fn first(&self) -> Option<Duration> {
        self.first
    }

    /// The mean time of the steps after the first, if any ran.
    pub fn per_step_after_first(&self) -> Option<Duration> {
        (self.rest_steps > 0).then(|| self.rest / self.rest_steps as u32)
    }

    /// "first step 14.20 s (warm-up), then 3.10 ms/step over 999 steps".
    pub fn summary(&self) -> String {
        match (self.first, self.per_step_after_first()) {
            (None, _) => "no training step".to_string(),
            (Some(first), None) => format!("first step {:.2} s (warm-up)", first.as_secs_f64()),
            (Some(first), Some(per)) => format!(
                "first step {:.2} s (warm-up), then {:.2} ms/step over {} steps",
                first.as_secs_f64(),
                per.as_secs_f64() * 1e3,
                self.rest_steps
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_step_is_kept_apart_from_the_mean_of_the_rest() {
        let ms = Duration::from_millis;
        let mut clock = StepClock::new();
        let t0 = clock.last;
        assert_eq!(clock.summary(), "no training step");
        clock.step_at(t0 + ms(2000));
        assert_eq!(clock.first(), Some(ms(2000)));
        assert_eq!(clock.per_step_after_first(), None);
        assert_eq!(clock.summary(), "first step 2.00 s (warm-up)");
        clock.step_at(t0 + ms(2010));
        // A checkpoint between two steps: not counted.
        clock.last = t0 + ms(2500);
        clock.step_at(t0 + ms(2530));
        assert_eq!(clock.per_step_after_first(), Some(ms(20)));
        assert_eq!(
            clock.summary(),
            "first step 2.00 s (warm-up), then 20.00 ms/step over 2 steps"
        );
        // pause_until_now moves the start of the next step to now.
        let before = Instant::now();
        clock.pause_until_now();
        assert!(clock.last >= before);
    }
}
