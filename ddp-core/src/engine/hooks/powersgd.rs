//! PowerSGD (Vogels et al., 2019), as PyTorch's `powerSGD_hook`: each gradient matrix M (n×m) is
//! sent as two thin matrices P (n×r) and Q (m×r) with M ≈ P·Qᵀ, and what the approximation
//! missed is added to the next step's gradient (error feedback), so nothing is lost for good.
//!
//! Its state (step count, random generator, per-bucket error feedback and Q memory, and the
//! parameters each bucket held) goes into checkpoints through [`CommHook::state`] and comes
//! back with [`CommHook::load_state`] (taken and checked in `powersgd/resume.rs`, laid out in bytes in `powersgd/state_format.rs`), so a resumed run
//! continues bit for bit (the guide's "Communication hooks and PowerSGD"). A state is only
//! restored into a hook with the same settings (the seed aside) whose buffers fit the saved
//! layouts; anything else is a named [`CommHookStateError`].

use super::comm_hook::{BucketParam, CommHook, CommHookStateError, GradBucket, HookError};
use super::hook_state::CommHookState;
use super::linalg::{expand, orthogonalize, project, project_t};
use crate::DdpError;
use burn::config::Config;
use ddp_comm::{ProcessGroup, ReduceOp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::ops::Range;

mod parked;
mod resume;
mod state_format;
#[cfg(test)]
mod tests;

use parked::Parked;

/// Settings of [`PowerSgdHook`], with PyTorch's names and meaning.
#[derive(Config, Debug)]
pub struct PowerSgdConfig {
    /// Rank of the approximation: bytes grow linearly with it, and so does the accuracy.
    #[config(default = 1)]
    pub rank: usize,
    /// Steps averaged exactly before compression starts (PyTorch's `start_powerSGD_iter`):
    /// early training moves fast, and the bucket layout settles after the first step.
    #[config(default = 10)]
    pub start_iter: usize,
    /// A matrix is compressed only when `n·m / ((n+m)·rank)` reaches this; smaller ones and
    /// vectors (biases) are averaged exactly.
    #[config(default = 2.0)]
    pub min_compression_rate: f64,
    /// Start each step's power iteration from the previous step's Q (one iteration then
    /// suffices).
    #[config(default = true)]
    pub warm_start: bool,
    /// Add what the approximation missed to the next step's gradient.
    #[config(default = true)]
    pub error_feedback: bool,
    /// Seed of the random initial Q (the same on every rank).
    #[config(default = 0)]
    pub seed: u64,
    /// Added to column norms in the orthogonalisation, so a zero column cannot divide by zero.
    #[config(default = 1e-8)]
    pub orthogonalization_epsilon: f32,
}

impl PowerSgdConfig {
    /// The hook.
    ///
    /// # Errors
    /// [`DdpError::InvalidConfig`] for a rank of 0, or a `start_iter` below 2 with warm start or
    /// error feedback (their state is per bucket, and buckets are laid out again after the
    /// first step).
    pub fn init(&self) -> Result<PowerSgdHook, DdpError> {
        if self.rank == 0 {
            return Err(DdpError::InvalidConfig(
                "PowerSGD rank must be at least 1".into(),
            ));
        }
        if self.start_iter < 2 && (self.warm_start || self.error_feedback) {
            return Err(DdpError::InvalidConfig(format!(
                "PowerSGD start_iter is {}: with warm start or error feedback it must be at \
                 least 2, because buckets are laid out again after the first step",
                self.start_iter
            )));
        }
        Ok(PowerSgdHook {
            rng: ChaCha8Rng::seed_from_u64(self.seed),
            config: self.clone(),
            iter: 0,
            error: HashMap::new(),
            q_memory: HashMap::new(),
            layouts: HashMap::new(),
            parked: Parked::default(),
        })
    }
}

/// The PowerSGD communication hook; see [`PowerSgdConfig`] and the [module docs](super).
#[derive(Debug)]
pub struct PowerSgdHook {
    config: PowerSgdConfig,
    rng: ChaCha8Rng,
    /// Steps seen (counted at each step's last bucket).
    iter: usize,
    /// Per bucket: what the last approximation missed.
    error: HashMap<usize, Vec<f32>>,
    /// Per bucket: the last Q of every compressed matrix, transposed (r×m), concatenated.
    q_memory: HashMap<usize, Vec<f32>>,
    /// Per bucket: the parameters (path, shape, offset) its error and Q belong to.
    layouts: HashMap<usize, Vec<BucketParam>>,
    /// This step's parameters whose bucket was laid out again, with their state.
    parked: Parked,
}

/// A compressed matrix: its range in the bucket, its shape, the rank used, and where its
/// factors start in the bucket's P and Q (the matrices' factors one after another).
struct Matrix {
    range: Range<usize>,
    n: usize,
    m: usize,
    r: usize,
    p_at: usize,
    q_at: usize,
}

impl Matrix {
    /// Its factor P (n×r) in the bucket's P.
    fn p(&self) -> Range<usize> {
        self.p_at..self.p_at + self.n * self.r
    }

    /// Its factor Q (m×r) in the bucket's Q.
    fn q(&self) -> Range<usize> {
        self.q_at..self.q_at + self.m * self.r
    }
}

impl PowerSgdHook {
    /// Steps seen so far.
    pub fn iterations(&self) -> usize {
        self.iter
    }

    fn split(&self, params: &[BucketParam]) -> (Vec<Matrix>, Vec<Range<usize>>) {
        let mut matrices = Vec::new();
        let mut plain = Vec::new();
        let (mut p_at, mut q_at) = (0, 0);
        for p in params {
            let numel = p.numel();
            if p.shape.len() >= 2 && numel > 0 {
                let n = p.shape[0];
                let m = numel / n;
                let r = self.config.rank.min(n).min(m);
                let rate = (n * m) as f64 / ((n + m) * r) as f64;
                if rate >= self.config.min_compression_rate {
                    matrices.push(Matrix {
                        range: p.range(),
                        n,
                        m,
                        r,
                        p_at,
                        q_at,
                    });
                    p_at += n * r;
                    q_at += m * r;
                    continue;
                }
            }
            plain.push(p.range());
        }
        (matrices, plain)
    }

    /// When bucket `index` holds other parameters than when its error and Q were kept (DDP
    /// laid the buckets out again, as a resumed run does), its state is parked by parameter
    /// and the bucket takes its parameters' parked state: all of it moves with the parameters
    /// (`powersgd/parked.rs`). A bucket with a parameter none was kept for starts afresh, as
    /// before: old state must not land on other parameters. Every rank sees the same layouts,
    /// so the ranks stay in step.
    fn forget_if_relaid(&mut self, bucket: &GradBucket) {
        let params = bucket.parameters();
        let index = bucket.index();
        let same = self
            .layouts
            .get(&index)
            .is_some_and(|kept| kept.as_slice() == params);
        if same {
            return;
        }
        if let Some(old) = self.layouts.remove(&index) {
            let q_ranges = self.q_ranges(&old);
            let (error, q) = (self.error.remove(&index), self.q_memory.remove(&index));
            self.parked.park(&old, error, q, &q_ranges);
        }
        let (error, q) = self
            .parked
            .take(params, &self.q_ranges(params))
            .unwrap_or((None, None));
        if let Some(error) = error {
            self.error.insert(index, error);
        }
        if let Some(q) = q {
            self.q_memory.insert(index, q);
        }
        self.layouts.insert(index, params.to_vec());
    }

    /// Where each compressed matrix of a bucket laid out as `layout` has its part of the
    /// bucket's Q: by the matrix's offset in the bucket.
    fn q_ranges(&self, layout: &[BucketParam]) -> Vec<(usize, Range<usize>)> {
        let (matrices, _) = self.split(layout);
        matrices.iter().map(|x| (x.range.start, x.q())).collect()
    }

    fn compress(&mut self, bucket: &mut GradBucket, pg: &ProcessGroup) -> Result<(), HookError> {
        self.forget_if_relaid(bucket);
        let index = bucket.index();
        let len = bucket.buffer().len();
        let eps = self.config.orthogonalization_epsilon;
        if self.config.error_feedback {
            let error = self.error.entry(index).or_insert_with(|| vec![0.0; len]);
            if error.len() == len {
                bucket
                    .buffer_mut()
                    .iter_mut()
                    .zip(error.iter())
                    .for_each(|(g, e)| *g += e);
            }
        }
        let input = self.config.error_feedback.then(|| bucket.buffer().to_vec());
        let (matrices, plain) = self.split(bucket.parameters());

        // Vectors and small matrices: one exact average.
        let mut exact: Vec<f32> = plain
            .iter()
            .flat_map(|r| bucket.buffer()[r.clone()].iter().copied())
            .collect();
        if !exact.is_empty() {
            pg.all_reduce(&mut exact, ReduceOp::Avg)?;
            let mut at = 0;
            for r in &plain {
                let n = r.len();
                bucket.buffer_mut()[r.clone()].copy_from_slice(&exact[at..at + n]);
                at += n;
            }
        }
        if matrices.is_empty() {
            return Ok(());
        }

        // Q: last step's (warm start) or fresh random orthonormal columns, equal on every rank.
        let q_len: usize = matrices.iter().map(|x| x.m * x.r).sum();
        let mut q = match self.q_memory.remove(&index) {
            Some(q) if self.config.warm_start && q.len() == q_len => q,
            _ => {
                let mut q: Vec<f32> = (0..q_len).map(|_| normal(&mut self.rng)).collect();
                for x in &matrices {
                    orthogonalize(&mut q[x.q()], x.m, x.r, eps);
                }
                q
            }
        };
        // P = M·Q, summed over ranks, orthogonalised.
        let p_len: usize = matrices.iter().map(|x| x.n * x.r).sum();
        let mut p = vec![0.0f32; p_len];
        for x in &matrices {
            let grad = &bucket.buffer()[x.range.clone()];
            project(grad, &q[x.q()], &mut p[x.p()], x.n, x.m, x.r);
        }
        pg.all_reduce(&mut p, ReduceOp::Sum)?;
        for x in &matrices {
            orthogonalize(&mut p[x.p()], x.n, x.r, eps);
        }
        // Q = Mᵀ·P, averaged over ranks; the result is P·Qᵀ.
        for x in &matrices {
            let grad = &bucket.buffer()[x.range.clone()];
            project_t(grad, &p[x.p()], &mut q[x.q()], x.n, x.m, x.r);
        }
        pg.all_reduce(&mut q, ReduceOp::Avg)?;
        for x in &matrices {
            let out = &mut bucket.buffer_mut()[x.range.clone()];
            expand(&p[x.p()], &q[x.q()], out, x.n, x.m, x.r);
        }
        if self.config.warm_start {
            self.q_memory.insert(index, q);
        }
        if let Some(input) = input {
            let error: Vec<f32> = input
                .iter()
                .zip(bucket.buffer())
                .map(|(i, o)| i - o)
                .collect();
            self.error.insert(index, error);
        }
        Ok(())
    }
}

impl CommHook for PowerSgdHook {
    fn reduce(&mut self, bucket: &mut GradBucket, pg: &ProcessGroup) -> Result<(), HookError> {
        let result = if self.iter < self.config.start_iter {
            pg.all_reduce(bucket.buffer_mut(), ReduceOp::Avg)
                .map_err(HookError::from)
        } else {
            self.compress(bucket, pg)
        };
        if bucket.is_last() {
            self.iter += 1;
            self.parked.clear();
        }
        result
    }

    fn name(&self) -> &str {
        POWERSGD
    }

    fn state(&self) -> Option<CommHookState> {
        Some(self.saved_state())
    }

    fn load_state(&mut self, state: CommHookState) -> Result<(), CommHookStateError> {
        self.restore_saved(state)
    }
}

/// The hook's name, in logs, errors and the states it writes.
const POWERSGD: &str = "PowerSGD";

/// A standard normal sample (Box-Muller), from the hook's seeded generator.
fn normal(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}
