//! Optimizer state between FSDP's chunks and the model's parameters, for checkpoints.
//!
//! FSDP's optimizer steps one flat chunk per unit, so its state (Adam's moments, SGD's
//! velocity) is one 1-D tensor per unit and rank. A checkpoint stores it per parameter, as
//! DDP's optimizer holds it, so that it reshards to any world size (and loads under DDP). FSDP
//! only works with optimizers that act element by element, so each state tensor of a chunk is
//! that many elements of the unit's flat buffer: joining the chunks of every rank and cutting
//! the result at the parameters' offsets gives each parameter's state, and back.
//!
//! burn's records are opaque types; their serde form is not. A record is encoded in CBOR (a
//! self-describing format: maps keep their field names, tensors their bytes, shape and dtype)
//! and every tensor in it is joined or cut; everything else (Adam's step count) must be equal
//! across the pieces. burn's optimizer record is `V1 -> Rank<D> -> state`: the variant names
//! the tensors' rank, so it is renamed with their new shape.

use burn::record::{FullPrecisionSettings, Record};
use burn::tensor::backend::Backend;
use ciborium::Value;
use std::ops::Range;

/// A record as CBOR bytes (full precision).
pub(super) fn encode<B: Backend, R: Record<B>>(record: R) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    ciborium::into_writer(&record.into_item::<FullPrecisionSettings>(), &mut bytes)
        .map_err(|e| format!("encoding an optimizer record: {e}"))?;
    Ok(bytes)
}

/// A record from CBOR [`Value`], its tensors placed on `device`.
pub(super) fn decode<B: Backend, R: Record<B>>(
    value: Value,
    device: &B::Device,
) -> Result<R, String> {
    let item: R::Item<FullPrecisionSettings> = value
        .deserialized()
        .map_err(|e| format!("decoding an optimizer record: {e}"))?;
    Ok(R::from_item(item, device))
}

/// CBOR bytes as a [`Value`].
pub(super) fn parse(bytes: &[u8]) -> Result<Value, String> {
    ciborium::from_reader(bytes).map_err(|e| format!("reading an optimizer record: {e}"))
}

/// [`Value`] as CBOR bytes.
pub(super) fn unparse(value: &Value) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    ciborium::into_writer(value, &mut bytes)
        .map_err(|e| format!("encoding an optimizer record: {e}"))?;
    Ok(bytes)
}

/// Joins `parts` (the same record over consecutive pieces of a flat buffer, in order, part `i`
/// over `sizes[i]` elements) into one record over `len` elements: each tensor is the parts'
/// tensors flattened end to end, then padded with zeros to `len`, as a 1-D tensor. A tensor
/// of another size than its part's is an error: that state is not one value per element.
pub(super) fn join(parts: &[Value], sizes: &[usize], len: usize) -> Result<Value, String> {
    if parts.is_empty() || parts.len() != sizes.len() {
        return Err("no optimizer state to join".into());
    }
    if sizes.iter().sum::<usize>() > len {
        return Err(format!(
            "the pieces hold {} elements, more than the {len} of the buffer",
            sizes.iter().sum::<usize>()
        ));
    }
    // Parameters of a unit have tensors of different ranks (a weight's 2, a bias's 1).
    let parts = parts
        .iter()
        .map(|p| with_rank(p.clone(), 1))
        .collect::<Result<Vec<_>, _>>()?;
    join_at(&parts, sizes, len, "")
}

/// The record for elements `range` of `whole`'s (1-D or flattened) tensors, shaped `shape`.
pub(super) fn cut(whole: &Value, range: Range<usize>, shape: &[usize]) -> Result<Value, String> {
    with_rank(cut_at(whole, &range, shape)?, shape.len())
}

/// A tensor's serde form: a map with `bytes`, `shape` and `dtype`.
fn tensor_fields(v: &Value) -> Option<(&[u8], Vec<usize>)> {
    let Value::Map(entries) = v else { return None };
    let field = |name: &str| {
        entries
            .iter()
            .find(|(k, _)| k.as_text() == Some(name))
            .map(|(_, v)| v)
    };
    let bytes = field("bytes")?.as_bytes()?;
    let shape = field("shape")?
        .as_array()?
        .iter()
        .map(|d| d.as_integer().and_then(|i| usize::try_from(i).ok()))
        .collect::<Option<Vec<usize>>>()?;
    field("dtype")?;
    Some((bytes.as_slice(), shape))
}

/// `v` (a tensor) with new bytes and shape.
fn with_tensor(v: &Value, bytes: Vec<u8>, shape: &[usize]) -> Value {
    let Value::Map(entries) = v else {
        return v.clone();
    };
    Value::Map(
        entries
            .iter()
            .map(|(k, old)| {
                let new = match k.as_text() {
                    Some("bytes") => Value::Bytes(bytes.clone()),
                    Some("shape") => {
                        Value::Array(shape.iter().map(|&d| Value::Integer(d.into())).collect())
                    }
                    _ => old.clone(),
                };
                (k.clone(), new)
            })
            .collect(),
    )
}

/// Bytes per element of a tensor (from its bytes and shape).
fn element_size(bytes: &[u8], shape: &[usize], at: &str) -> Result<usize, String> {
    let n: usize = shape.iter().product();
    if n == 0 || !bytes.len().is_multiple_of(n) {
        return Err(format!(
            "the optimizer state tensor at '{at}' has {} bytes for shape {shape:?}",
            bytes.len()
        ));
    }
    Ok(bytes.len() / n)
}

fn join_at(parts: &[Value], sizes: &[usize], len: usize, at: &str) -> Result<Value, String> {
    let first = &parts[0];
    if tensor_fields(first).is_some() {
        let mut out = Vec::new();
        let mut size = None;
        for (p, &expected) in parts.iter().zip(sizes) {
            let (bytes, shape) = tensor_fields(p)
                .ok_or_else(|| format!("the pieces' optimizer states differ at '{at}'"))?;
            let n: usize = shape.iter().product();
            if n != expected {
                return Err(format!(
                    "the optimizer state tensor at '{at}' has {n} elements for a piece of \
                     {expected}: it is not one value per element, which FSDP needs"
                ));
            }
            if n == 0 {
                continue;
            }
            let s = element_size(bytes, &shape, at)?;
            if *size.get_or_insert(s) != s {
                return Err(format!(
                    "the pieces' optimizer states differ in dtype at '{at}'"
                ));
            }
            out.extend_from_slice(bytes);
        }
        out.resize(len * size.unwrap_or(4), 0);
        return Ok(with_tensor(first, out, &[len]));
    }
    match first {
        Value::Map(entries) => {
            let mut joined = Vec::with_capacity(entries.len());
            for (i, (k, _)) in entries.iter().enumerate() {
                let name = format!("{at}.{}", k.as_text().unwrap_or("?"));
                let column = parts
                    .iter()
                    .map(|p| match p {
                        Value::Map(e) if e.len() == entries.len() && &e[i].0 == k => {
                            Ok(e[i].1.clone())
                        }
                        _ => Err(format!("the pieces' optimizer states differ at '{name}'")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                joined.push((k.clone(), join_at(&column, sizes, len, &name)?));
            }
            Ok(Value::Map(joined))
        }
        Value::Array(items) => {
            let mut joined = Vec::with_capacity(items.len());
            for i in 0..items.len() {
                let name = format!("{at}[{i}]");
                let column = parts
                    .iter()
                    .map(|p| match p {
                        Value::Array(a) if a.len() == items.len() => Ok(a[i].clone()),
                        _ => Err(format!("the pieces' optimizer states differ at '{name}'")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                joined.push(join_at(&column, sizes, len, &name)?);
            }
            Ok(Value::Array(joined))
        }
        // Not per element (a step count): every piece must hold the same.
        other => {
            if parts.iter().any(|p| p != other) {
                return Err(format!(
                    "the optimizer state at '{at}' differs between the pieces of one unit's \
                     chunk (its parameters, or the ranks holding them), so it is not element by \
                     element. FSDP steps a unit's parameters together: they need an \
                     element-wise optimizer and the same step count (a DDP or ZeRO checkpoint \
                     in which some of them got no gradient on some steps has fewer steps for \
                     those; give them a unit of their own, or resume that run with DDP)"
                ));
            }
            Ok(other.clone())
        }
    }
}

fn cut_at(v: &Value, range: &Range<usize>, shape: &[usize]) -> Result<Value, String> {
    if let Some((bytes, old_shape)) = tensor_fields(v) {
        if range.is_empty() {
            return Ok(with_tensor(v, Vec::new(), shape));
        }
        let size = element_size(bytes, &old_shape, "a tensor")?;
        let piece = bytes
            .get(range.start * size..range.end * size)
            .ok_or_else(|| {
                format!(
                    "elements {range:?} lie outside an optimizer state tensor of shape \
                     {old_shape:?}"
                )
            })?
            .to_vec();
        return Ok(with_tensor(v, piece, shape));
    }
    Ok(match v {
        Value::Map(entries) => Value::Map(
            entries
                .iter()
                .map(|(k, x)| Ok((k.clone(), cut_at(x, range, shape)?)))
                .collect::<Result<_, String>>()?,
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|x| cut_at(x, range, shape))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

/// Renames burn's `V1 -> Rank<D>` variant of an optimizer record for tensors of rank `rank`.
fn with_rank(record: Value, rank: usize) -> Result<Value, String> {
    let unexpected = || {
        "unexpected optimizer record layout (burn's OptimizerAdaptor record, \
         V1 -> Rank<D> -> state, was expected)"
            .to_string()
    };
    let Value::Map(mut outer) = record else {
        return Err(unexpected());
    };
    let [(version, inner)] = outer.as_mut_slice() else {
        return Err(unexpected());
    };
    if version.as_text() != Some("V1") {
        return Err(unexpected());
    }
    let Value::Map(variants) = inner else {
        return Err(unexpected());
    };
    let [(variant, _)] = variants.as_mut_slice() else {
        return Err(unexpected());
    };
    if !variant.as_text().is_some_and(|t| t.starts_with("Rank")) {
        return Err(unexpected());
    }
    *variant = Value::Text(format!("Rank{rank}"));
    Ok(Value::Map(outer))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An optimizer record as burn's adaptor serialises it: one tensor and a step count.
    fn record(rank: usize, values: &[f32], shape: &[usize], time: i64) -> Value {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let tensor = Value::Map(vec![
            (Value::Text("bytes".into()), Value::Bytes(bytes)),
            (
                Value::Text("shape".into()),
                Value::Array(shape.iter().map(|&d| Value::Integer(d.into())).collect()),
            ),
            (Value::Text("dtype".into()), Value::Text("F32".into())),
        ]);
        let state = Value::Map(vec![
            (Value::Text("moment".into()), tensor),
            (Value::Text("time".into()), Value::Integer(time.into())),
        ]);
        let variant = Value::Map(vec![(Value::Text(format!("Rank{rank}")), state)]);
        Value::Map(vec![(Value::Text("V1".into()), variant)])
    }

    #[test]
    fn chunks_join_and_cut_into_parameters_and_back() {
        // Two ranks' chunks of a 5-element unit padded to 6: a 2x2 weight, then a bias of 1.
        let chunks = [
            record(1, &[1.0, 2.0, 3.0], &[3], 7),
            record(1, &[4.0, 5.0, 0.0], &[3], 7),
        ];
        let whole = join(&chunks, &[3, 3], 6).unwrap();
        let weight = cut(&whole, 0..4, &[2, 2]).unwrap();
        let bias = cut(&whole, 4..5, &[1]).unwrap();
        assert_eq!(weight, record(2, &[1.0, 2.0, 3.0, 4.0], &[2, 2], 7));
        assert_eq!(bias, record(1, &[5.0], &[1], 7));
        // Back, at 3 ranks: 5 elements padded to 6, 2 per rank.
        let whole = join(&[weight, bias], &[4, 1], 6).unwrap();
        assert_eq!(
            cut(&whole, 4..6, &[2]).unwrap(),
            record(1, &[5.0, 0.0], &[2], 7)
        );
    }

    #[test]
    fn state_that_is_not_per_element_is_an_error() {
        let chunks = [record(1, &[1.0], &[1], 7), record(1, &[2.0], &[1], 7)];
        let err = join(&chunks, &[3, 3], 6).unwrap_err();
        assert!(err.contains("not one value per element"), "{err}");
        let steps = [record(1, &[1.0], &[1], 7), record(1, &[2.0], &[1], 8)];
        let err = join(&steps, &[1, 1], 2).unwrap_err();
        assert!(err.contains("the same step count"), "{err}");
    }
}
