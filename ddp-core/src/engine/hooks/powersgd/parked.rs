//! PowerSGD's state of parameters whose bucket DDP laid out again, kept by parameter until a
//! bucket holding them asks for it. A run that resumes PowerSGD's state starts with DDP's
//! initial bucket layout, then lays the buckets out in arrival order, while the saved state
//! is per bucket of the saved run's layout: the error feedback and Q memory of each parameter
//! move with it into whichever bucket now holds it (elementwise and per matrix, PowerSGD's
//! results do not depend on which bucket a parameter is in), so the resume stays bit for bit.

use crate::engine::hooks::BucketParam;
use std::collections::HashMap;
use std::ops::Range;

/// A bucket's error feedback and Q memory, each if it has one.
pub(super) type BucketBuffers = (Option<Vec<f32>>, Option<Vec<f32>>);

/// One parameter's share of its old bucket's state.
struct ParkedParam {
    shape: Vec<usize>,
    error: Option<Vec<f32>>,
    /// Its Q (m×r), when it was a compressed matrix with a Q memory.
    q: Option<Vec<f32>>,
}

/// The parked parameters, by path.
#[derive(Default)]
pub(super) struct Parked {
    by_path: HashMap<String, ParkedParam>,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked")
            .field("params", &self.by_path.len())
            .finish()
    }
}

impl Parked {
    /// Parks the state of a bucket laid out as `layout`: its `error` (as long as the bucket)
    /// and its `q` memory, of which `q_ranges` gives each compressed matrix's part (by the
    /// matrix's offset in the bucket).
    pub(super) fn park(
        &mut self,
        layout: &[BucketParam],
        error: Option<Vec<f32>>,
        q: Option<Vec<f32>>,
        q_ranges: &[(usize, Range<usize>)],
    ) {
        for p in layout {
            let error = error
                .as_ref()
                .and_then(|e| e.get(p.range()))
                .map(<[f32]>::to_vec);
            let q = q.as_ref().and_then(|q| {
                q_ranges
                    .iter()
                    .find(|(offset, _)| *offset == p.offset)
                    .and_then(|(_, range)| q.get(range.clone()))
                    .map(<[f32]>::to_vec)
            });
            self.by_path.insert(
                p.path.clone(),
                ParkedParam {
                    shape: p.shape.clone(),
                    error,
                    q,
                },
            );
        }
    }

    /// The state of a bucket laid out as `layout` (with compressed matrices at `q_ranges`),
    /// assembled from parked parameters and taken out of the pool, when every one of its
    /// parameters is parked with its shape: its error (when every parameter has one) and its
    /// Q memory (when every matrix has one). `None` when one is missing: the bucket starts
    /// afresh.
    pub(super) fn take(
        &mut self,
        layout: &[BucketParam],
        q_ranges: &[(usize, Range<usize>)],
    ) -> Option<BucketBuffers> {
        let all_parked = layout.iter().all(|p| {
            self.by_path
                .get(&p.path)
                .is_some_and(|parked| parked.shape == p.shape)
        });
        if !all_parked || layout.is_empty() {
            return None;
        }
        let parked: Vec<ParkedParam> = layout
            .iter()
            .filter_map(|p| self.by_path.remove(&p.path))
            .collect();
        let error = parked
            .iter()
            .map(|p| p.error.as_deref())
            .collect::<Option<Vec<&[f32]>>>()
            .map(|parts| parts.concat());
        let q = q_ranges
            .iter()
            .map(|(offset, _)| {
                let i = layout.iter().position(|p| p.offset == *offset)?;
                parked[i].q.as_deref()
            })
            .collect::<Option<Vec<&[f32]>>>()
            .map(|parts| parts.concat())
            .filter(|q| !q.is_empty());
        Some((error, q))
    }

    /// Forgets every parked parameter (at the end of a step: no bucket holds them now).
    pub(super) fn clear(&mut self) {
        self.by_path.clear();
    }
}
