//! Canonical safetensors bytes: the same tensors always give the same file.
//!
//! burn's `SafetensorsStore` passes its metadata (`format`, `producer`, `version`) as a
//! `HashMap`, so the JSON header lists those keys in a random order and two saves of equal
//! tensors differ in a few bytes. Rewriting the header with every object's keys sorted makes
//! checkpoints comparable byte for byte (and their sha256 in the manifest stable). The data
//! section is kept as is: its offsets are relative to its start.

/// Safetensors files begin with the header's length as a little-endian u64.
/// Bytes of the little-endian header length that starts a safetensors file.
pub(crate) const LEN_BYTES: usize = 8;
/// The format pads the header with spaces to a multiple of 8 bytes.
const HEADER_ALIGN: usize = 8;

/// Where a safetensors file's JSON header ends (it starts at byte 8, after its length).
///
/// # Errors
/// The file is shorter than its 8-byte length, or than the length it announces.
pub(crate) fn header_end(bytes: &[u8]) -> Result<usize, String> {
    let len_bytes: [u8; LEN_BYTES] = bytes
        .get(..LEN_BYTES)
        .and_then(|b| b.try_into().ok())
        .ok_or("shorter than the 8-byte header length")?;
    let len = usize::try_from(u64::from_le_bytes(len_bytes))
        .map_err(|_| "header length does not fit in memory")?;
    LEN_BYTES
        .checked_add(len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| {
            format!(
                "header length {len} exceeds the file ({} bytes)",
                bytes.len()
            )
        })
}

/// `bytes` (a safetensors file) with its header rewritten in canonical form: compact JSON,
/// every object's keys sorted, padded with spaces to a multiple of 8 bytes.
///
/// # Errors
/// A message saying what is wrong with the header (a file burn produced never has one).
pub(crate) fn canonical_safetensors(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let end = header_end(bytes)?;
    let header: serde_json::Value = serde_json::from_slice(&bytes[LEN_BYTES..end])
        .map_err(|e| format!("header is not JSON: {e}"))?;
    let mut json =
        serde_json::to_vec(&sorted(header)).map_err(|e| format!("cannot write the header: {e}"))?;
    json.resize(json.len().next_multiple_of(HEADER_ALIGN), b' ');
    let mut out = Vec::with_capacity(LEN_BYTES + json.len() + bytes.len() - end);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[end..]);
    Ok(out)
}

/// `value` with every object's keys in sorted order (whatever map serde_json was built with).
fn sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sorted).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn key_order_no_longer_matters_and_the_data_is_kept() {
        let data = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let a = file(
            r#"{"__metadata__":{"producer":"burn","format":"safetensors"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            &data,
        );
        let b = file(
            r#"{"w":{"shape":[2],"dtype":"F32","data_offsets":[0,8]},"__metadata__":{"format":"safetensors","producer":"burn"}}  "#,
            &data,
        );
        let (ca, cb) = (
            canonical_safetensors(&a).expect("a"),
            canonical_safetensors(&b).expect("b"),
        );
        assert_eq!(ca, cb);
        let len = u64::from_le_bytes(ca[..8].try_into().expect("8 bytes")) as usize;
        assert_eq!(len % 8, 0);
        assert_eq!(&ca[8 + len..], &data);
        assert!(
            std::str::from_utf8(&ca[8..8 + len])
                .expect("utf-8")
                .starts_with(r#"{"__metadata__":{"format":"safetensors","producer":"burn"},"w":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}}"#)
        );
        // Idempotent.
        assert_eq!(canonical_safetensors(&ca).expect("again"), ca);
    }

    #[test]
    fn broken_headers_are_errors_not_panics() {
        assert!(canonical_safetensors(&[1, 2]).is_err());
        assert!(canonical_safetensors(&file("{", &[])).is_err());
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(canonical_safetensors(&huge).is_err());
    }
}
