//! Making the ranks' models equal: at construction every rank checks that it holds the same
//! model as the others, then takes rank 0's values and parameter ids, byte for byte; during
//! training, buffers follow rank 0 ([`read_values`] / [`write_values`] on the buffers only).

use crate::engine::params::{ParamEntry, ParamTable, flush_running_states};
use crate::error::DdpError;
use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use ddp_comm::{ProcessGroup, ReduceOp};

/// [`ProcessGroup::broadcast_bytes`], with DDP's error.
pub(crate) fn broadcast_bytes(
    pg: &ProcessGroup,
    bytes: Vec<u8>,
    root: usize,
) -> Result<Vec<u8>, DdpError> {
    pg.broadcast_bytes(bytes, root)
        .map_err(DdpError::comm("broadcasting bytes"))
}

/// Fails on every rank, with the same message, if any rank's parameter list differs from rank
/// 0's: the message names the first differing parameter path and both shapes.
pub(crate) fn verify_same_model<I: Backend>(
    pg: &ProcessGroup,
    table: &ParamTable<I>,
) -> Result<(), DdpError> {
    let mine: Vec<String> = table.entries.iter().map(ParamEntry::signature).collect();
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

/// Makes every rank's module equal to rank 0's: every float tensor's bytes in its own dtype
/// (f64 stays exact) and every parameter's id (so optimizer state keyed by `ParamId` matches on
/// every rank). The tables must already agree (see [`verify_same_model`]).
pub(crate) fn broadcast_module<B: AutodiffBackend, M: AutodiffModule<B>>(
    pg: &ProcessGroup,
    module: M,
    table: &ParamTable<B::InnerBackend>,
) -> Result<M, DdpError> {
    let every: Vec<bool> = vec![true; table.entries.len()];
    let bytes = if pg.rank() == 0 {
        read_values(&module, &every, true)
    } else {
        Vec::new()
    };
    let bytes = broadcast_bytes(pg, bytes, 0)?;
    if pg.rank() == 0 {
        return Ok(module);
    }
    write_values(module, &every, true, &bytes)
}

/// The bytes of the selected float tensors in module order: per tensor its id (with `ids`),
/// its byte length and its bytes.
pub(crate) fn read_values<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    select: &[bool],
    ids: bool,
) -> Vec<u8> {
    flush_running_states::<B, M>(module);
    let mut read = ReadValues {
        next: 0,
        select,
        ids,
        out: Vec::new(),
    };
    module.visit(&mut read);
    read.out
}

/// Writes bytes from [`read_values`] (with the same `select` and `ids`) into the module.
pub(crate) fn write_values<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: M,
    select: &[bool],
    ids: bool,
    bytes: &[u8],
) -> Result<M, DdpError> {
    // A pending update would overwrite the written value at the next `value_sync`.
    flush_running_states::<B, M>(&module);
    let mut write = WriteValues {
        next: 0,
        select,
        ids,
        bytes,
        at: 0,
        error: None,
    };
    let module = module.map(&mut write);
    match write.error {
        Some(e) => Err(DdpError::ModelMismatch(e)),
        None if write.at != bytes.len() => Err(DdpError::ModelMismatch(format!(
            "rank 0 sent {} bytes of tensors, this rank's model holds {}",
            bytes.len(),
            write.at
        ))),
        None => Ok(module),
    }
}

struct ReadValues<'a> {
    next: usize,
    select: &'a [bool],
    ids: bool,
    out: Vec<u8>,
}

impl<B: Backend> ModuleVisitor<B> for ReadValues<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let index = self.next;
        self.next += 1;
        if !self.select.get(index).copied().unwrap_or(false) {
            return;
        }
        if self.ids {
            self.out.extend_from_slice(&param.id.val().to_le_bytes());
        }
        let data = param.val().into_data();
        let bytes = data.as_bytes();
        self.out
            .extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        self.out.extend_from_slice(bytes);
    }
}

struct WriteValues<'a> {
    next: usize,
    select: &'a [bool],
    ids: bool,
    bytes: &'a [u8],
    at: usize,
    error: Option<String>,
}

impl WriteValues<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let out = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(out)
    }

    fn take_u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
}

impl<B: Backend> ModuleMapper<B> for WriteValues<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let index = self.next;
        self.next += 1;
        if self.error.is_some() || !self.select.get(index).copied().unwrap_or(false) {
            return param;
        }
        let (local_id, tensor, mapper) = param.consume();
        let id = if self.ids {
            self.take_u64().map(ParamId::from)
        } else {
            Some(local_id)
        };
        let (shape, dtype, device) = (tensor.shape(), tensor.dtype(), tensor.device());
        let expected = shape.num_elements() * dtype.size();
        let len = self.take_u64();
        let bytes = match (id, len) {
            (Some(_), Some(len)) if len == expected as u64 => {
                self.take(expected).map(<[u8]>::to_vec)
            }
            _ => None,
        };
        match (id, bytes) {
            (Some(id), Some(bytes)) => {
                let data = TensorData::from_bytes_vec(bytes, shape, dtype);
                let value = Tensor::<B, D>::from_data(data, (&device, dtype))
                    .set_require_grad(tensor.is_require_grad());
                Param::from_mapped_value(id, value, mapper)
            }
            _ => {
                self.error = Some(format!(
                    "tensor #{index} ({:?}, {dtype:?}) does not match the {expected} bytes rank 0 sent",
                    tensor.dims()
                ));
                Param::from_mapped_value(local_id, tensor, mapper)
            }
        }
    }
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
