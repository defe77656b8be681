//! Construction-time agreement: every rank checks that it holds the same model as the others,
//! then takes rank 0's values and parameter ids.

use crate::error::DdpError;
use crate::params::ParamInfo;
use burn::module::AutodiffModule;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use ddp_comm::{ProcessGroup, ReduceOp};

/// Sends `bytes` from `root` to every rank (length first, then the bytes).
pub(crate) fn broadcast_bytes(
    pg: &ProcessGroup,
    bytes: Vec<u8>,
    root: usize,
) -> Result<Vec<u8>, DdpError> {
    let mut len = [bytes.len() as i64];
    pg.broadcast(&mut len, root)
        .map_err(DdpError::comm("broadcasting a length"))?;
    let mut buf = if pg.rank() == root {
        bytes
    } else {
        vec![0u8; len[0].max(0) as usize]
    };
    pg.broadcast(&mut buf, root)
        .map_err(DdpError::comm("broadcasting bytes"))?;
    Ok(buf)
}

/// Fails on every rank, with the same message, if any rank's parameter list differs from rank
/// 0's: the message names the first differing parameter path and both shapes.
pub(crate) fn verify_same_model(pg: &ProcessGroup, params: &[ParamInfo]) -> Result<(), DdpError> {
    let mine: Vec<String> = params.iter().map(ParamInfo::signature).collect();
    let encoded = mine.join("\n").into_bytes();
    // Cheap check first: every rank compares a hash; only on disagreement exchange the lists.
    let hash = fnv1a(&encoded) as i64;
    let mut lo = [hash];
    let mut hi = [hash];
    pg.all_reduce(&mut lo, ReduceOp::Min)
        .map_err(DdpError::comm("comparing models"))?;
    pg.all_reduce(&mut hi, ReduceOp::Max)
        .map_err(DdpError::comm("comparing models"))?;
    if lo == hi {
        return Ok(());
    }
    let mut lists = Vec::with_capacity(pg.world_size());
    for root in 0..pg.world_size() {
        let bytes = broadcast_bytes(
            pg,
            if root == pg.rank() {
                encoded.clone()
            } else {
                Vec::new()
            },
            root,
        )?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        lists.push(text.lines().map(str::to_string).collect::<Vec<_>>());
    }
    Err(DdpError::ModelMismatch(describe_difference(&lists)))
}

/// Names the first difference between rank 0's list and another rank's.
fn describe_difference(lists: &[Vec<String>]) -> String {
    let field = |line: &str, i: usize| line.split('\t').nth(i).unwrap_or("").to_string();
    let base = &lists[0];
    for (rank, other) in lists.iter().enumerate().skip(1) {
        for i in 0..base.len().max(other.len()) {
            match (base.get(i), other.get(i)) {
                (Some(a), Some(b)) if a == b => continue,
                (Some(a), Some(b)) if field(a, 0) == field(b, 0) => {
                    return format!(
                        "parameter '{}' has shape {} ({}, {}) on rank 0 but {} ({}, {}) on rank {rank}",
                        field(a, 0),
                        field(a, 1),
                        field(a, 2),
                        field(a, 3),
                        field(b, 1),
                        field(b, 2),
                        field(b, 3)
                    );
                }
                (Some(a), Some(b)) => {
                    return format!(
                        "parameter #{i} is '{}' with shape {} on rank 0 but '{}' with shape {} on rank {rank}",
                        field(a, 0),
                        field(a, 1),
                        field(b, 0),
                        field(b, 1)
                    );
                }
                (Some(a), None) => {
                    return format!(
                        "rank 0 has {} parameters, rank {rank} has {}; first missing on rank {rank}: '{}' with shape {}",
                        base.len(),
                        other.len(),
                        field(a, 0),
                        field(a, 1)
                    );
                }
                (None, Some(b)) => {
                    return format!(
                        "rank 0 has {} parameters, rank {rank} has {}; first extra on rank {rank}: '{}' with shape {}",
                        base.len(),
                        other.len(),
                        field(b, 0),
                        field(b, 1)
                    );
                }
                (None, None) => unreachable!("loop bound is the longer list"),
            }
        }
    }
    "the ranks' parameter lists hash differently but compare equal".to_string()
}

/// Makes every rank's module equal to rank 0's: values, buffers and parameter ids, through
/// burn's record (so optimizer state keyed by `ParamId` matches on every rank).
pub(crate) fn broadcast_module<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: M,
    device: &B::Device,
) -> Result<M, DdpError> {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = if pg.rank() == 0 {
        recorder
            .record(module.clone().into_record(), ())
            .map_err(|e| DdpError::Record {
                context: "serialising rank 0's model",
                reason: e.to_string(),
            })?
    } else {
        Vec::new()
    };
    let bytes = broadcast_bytes(pg, bytes, 0)?;
    if pg.rank() == 0 {
        return Ok(module);
    }
    let record = recorder.load(bytes, device).map_err(|e| DdpError::Record {
        context: "loading rank 0's model",
        reason: e.to_string(),
    })?;
    Ok(module.load_record(record))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn difference_names_path_and_both_shapes() {
        let a = vec!["fc.weight\t[4, 2]\tF32\tparam".to_string()];
        let b = vec!["fc.weight\t[4, 3]\tF32\tparam".to_string()];
        let msg = describe_difference(&[a, b]);
        assert!(msg.contains("'fc.weight' has shape [4, 2]"), "{msg}");
        assert!(msg.contains("[4, 3]"), "{msg}");
        assert!(msg.contains("rank 1"), "{msg}");
    }

    #[test]
    fn missing_parameter_is_named() {
        let a = vec![
            "a\t[1]\tF32\tparam".to_string(),
            "b\t[2]\tF32\tparam".to_string(),
        ];
        let b = vec!["a\t[1]\tF32\tparam".to_string()];
        let msg = describe_difference(&[a, b]);
        assert!(
            msg.contains("rank 0 has 2 parameters, rank 1 has 1"),
            "{msg}"
        );
        assert!(msg.contains("'b'"), "{msg}");
    }
}
