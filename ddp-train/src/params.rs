//! Checking that every rank built the same model, before ddp-core's engine takes over (it makes
//! the values equal and averages the gradients).
//!
//! Why a path-free signature in module order and not `ParamId`s: ids are random per process
//! until a module has been loaded from rank 0's record; the visitor order of one architecture
//! is the same everywhere.

use crate::error::{DdpTrainError, Result};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ddp_core::comm::ProcessGroup;

/// One line per float tensor: path-free signature (index, shape, dtype, trainable), hashed.
///
/// Used to refuse training when the ranks built different models, which would otherwise reduce
/// unrelated numbers into each other.
pub(crate) fn fingerprint<B: Backend, M: Module<B>>(module: &M) -> (u64, usize) {
    struct Sig(Vec<String>);
    impl<B: Backend> ModuleVisitor<B> for Sig {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            self.0.push(format!(
                "{:?}:{:?}:{}",
                t.dims(),
                t.dtype(),
                t.is_require_grad()
            ));
        }
    }
    let mut sig = Sig(Vec::new());
    module.visit(&mut sig);
    // FNV-1a: stable across processes and platforms (std's hasher is seeded per process).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in sig.0.join("|").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash, sig.0.len())
}

/// Checks that every rank holds a model with the same tensors (shapes, dtypes, kinds).
///
/// # Collective
/// Every rank calls it at the same point.
pub(crate) fn verify_same_model<B: Backend, M: Module<B>>(
    pg: &ProcessGroup,
    module: &M,
) -> Result<()> {
    let (hash, count) = fingerprint::<B, M>(module);
    let mine = [hash as i64, count as i64];
    let mut all = vec![0i64; 2 * pg.world_size()];
    pg.all_gather(&mine, &mut all)
        .map_err(DdpTrainError::comm("comparing the ranks' models"))?;
    let differing: Vec<usize> = (0..pg.world_size())
        .filter(|&r| all[2 * r..2 * r + 2] != all[0..2])
        .collect();
    if differing.is_empty() {
        Ok(())
    } else {
        Err(DdpTrainError::ModelMismatch(format!(
            "rank 0 has {} float tensors (signature {:#x}); ranks {differing:?} differ \
             (this rank: {count} tensors, {hash:#x}); build the same architecture on every rank",
            all[1], all[0] as u64
        )))
    }
}
