//! Just enough of the safetensors format to list a shard's tensors and to merge the shards
//! into one file (header: little-endian u64 length, JSON `{name: {dtype, shape,
//! data_offsets}}`; then the data). The merged file is canonical like the rank-0 checkpoint's
//! model (sorted keys, data in name order), so equal models give equal bytes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::super::canonical::{LEN_BYTES, header_end};

const HEADER_ALIGN: usize = 8;
const METADATA_KEY: &str = "__metadata__";

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct RawTensor {
    pub(super) dtype: String,
    pub(super) shape: Vec<usize>,
    pub(super) data_offsets: [usize; 2],
}

/// The tensors of a safetensors file (without metadata) and where its data begins.
pub(super) fn tensors(bytes: &[u8]) -> Result<(BTreeMap<String, RawTensor>, usize), String> {
    let start = header_end(bytes)?;
    let mut header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&bytes[LEN_BYTES..start])
            .map_err(|e| format!("header is not a JSON object: {e}"))?;
    header.remove(METADATA_KEY);
    let mut out = BTreeMap::new();
    for (name, value) in header {
        let t: RawTensor = serde_json::from_value(value)
            .map_err(|e| format!("tensor {name} has a bad header entry: {e}"))?;
        let [a, b] = t.data_offsets;
        if a > b || start + b > bytes.len() {
            return Err(format!(
                "tensor {name}'s data {a}..{b} lies outside the file's {} data bytes",
                bytes.len() - start
            ));
        }
        out.insert(name, t);
    }
    Ok((out, start))
}

/// One safetensors file holding every tensor of `files`, in canonical form.
///
/// # Errors
/// A message naming the bad file (its index) or the tensor found in two files.
pub(super) fn merge(files: &[&[u8]]) -> Result<Vec<u8>, String> {
    let mut all: BTreeMap<String, (RawTensor, &[u8])> = BTreeMap::new();
    for (i, bytes) in files.iter().enumerate() {
        let (tensors, start) = tensors(bytes).map_err(|e| format!("shard {i}: {e}"))?;
        for (name, t) in tensors {
            let data = &bytes[start + t.data_offsets[0]..start + t.data_offsets[1]];
            if all.insert(name.clone(), (t, data)).is_some() {
                return Err(format!("tensor {name} is in more than one shard"));
            }
        }
    }
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, (t, bytes)) in &all {
        let begin = data.len();
        data.extend_from_slice(bytes);
        let entry = RawTensor {
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
            data_offsets: [begin, data.len()],
        };
        header.insert(
            name.clone(),
            serde_json::to_value(entry).map_err(|e| e.to_string())?,
        );
    }
    Ok(assemble(&serde_json::Value::Object(header), &data))
}

/// A safetensors file with no tensors (a rank that owns none).
pub(super) fn empty() -> Vec<u8> {
    assemble(&serde_json::Value::Object(serde_json::Map::new()), &[])
}

fn assemble(header: &serde_json::Value, data: &[u8]) -> Vec<u8> {
    // A `Value` always serialises.
    let mut json = serde_json::to_vec(header).unwrap_or_else(|_| b"{}".to_vec());
    json.resize(json.len().next_multiple_of(HEADER_ALIGN), b' ');
    let mut out = Vec::with_capacity(LEN_BYTES + json.len() + data.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, bytes) in entries {
            let begin = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": "U8", "shape": [bytes.len()], "data_offsets": [begin, data.len()]}),
            );
        }
        header.insert(METADATA_KEY.into(), serde_json::json!({"format": "pt"}));
        assemble(&serde_json::Value::Object(header), &data)
    }

    #[test]
    fn merging_keeps_every_tensor_and_its_bytes() {
        let a = file(&[("b.weight", &[1, 2, 3]), ("a.bias", &[4])]);
        let b = file(&[("c", &[5, 6])]);
        let merged = merge(&[&a, &empty(), &b]).expect("merge");
        let (tensors, start) = tensors(&merged).expect("parse");
        let names: Vec<&str> = tensors.keys().map(String::as_str).collect();
        assert_eq!(names, ["a.bias", "b.weight", "c"]);
        let data = |n: &str| {
            let t = &tensors[n];
            merged[start + t.data_offsets[0]..start + t.data_offsets[1]].to_vec()
        };
        assert_eq!(
            (data("a.bias"), data("b.weight"), data("c")),
            (vec![4], vec![1, 2, 3], vec![5, 6])
        );
        assert_eq!(
            merge(&[&b, &a]).expect("again"),
            merged,
            "order-independent"
        );
    }

    #[test]
    fn a_tensor_in_two_shards_and_broken_files_are_errors() {
        let a = file(&[("w", &[1])]);
        assert!(merge(&[&a, &a]).unwrap_err().contains("tensor w"));
        assert!(merge(&[&[1, 2]]).unwrap_err().contains("shard 0"));
        let mut cut = a.clone();
        cut.pop();
        assert!(tensors(&cut).is_err());
    }
}
