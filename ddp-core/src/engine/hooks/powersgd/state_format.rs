//! The bytes of a [`PowerSgdHook`](super::PowerSgdHook)'s state (format version 1): the
//! settings it ran with, its step count, its random generator's position and, per bucket, the
//! parameters the bucket held, its error feedback and its Q memory. Kept apart from the hook's
//! arithmetic: this file only says how that state is laid out in bytes, little-endian, f32
//! buffers bit for bit.

use crate::engine::hooks::BucketParam;

/// The format version this build writes and reads.
pub(super) const POWERSGD_STATE_VERSION: u32 = 1;

/// The settings that change what PowerSGD computes; a state is only restored into a hook with
/// the same ones. (The seed is not among them: the generator's position is restored itself.)
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Settings {
    pub(super) rank: u64,
    pub(super) start_iter: u64,
    pub(super) min_compression_rate: f64,
    pub(super) warm_start: bool,
    pub(super) error_feedback: bool,
    pub(super) orthogonalization_epsilon: f32,
}

impl Settings {
    /// The first setting that differs from `current`: its name, its value here (saved) and
    /// in `current`.
    pub(super) fn first_difference(
        &self,
        current: &Settings,
    ) -> Option<(&'static str, String, String)> {
        self.named_values()
            .into_iter()
            .zip(current.named_values())
            .find(|((_, saved), (_, now))| saved != now)
            .map(|((name, saved), (_, now))| (name, saved, now))
    }

    /// Every setting's name and value, as errors show them.
    fn named_values(&self) -> [(&'static str, String); 6] {
        [
            ("rank", self.rank.to_string()),
            ("start_iter", self.start_iter.to_string()),
            (
                "min_compression_rate",
                format!("{:?}", self.min_compression_rate),
            ),
            ("warm_start", self.warm_start.to_string()),
            ("error_feedback", self.error_feedback.to_string()),
            (
                "orthogonalization_epsilon",
                format!("{:?}", self.orthogonalization_epsilon),
            ),
        ]
    }
}

/// One bucket's state.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct BucketState {
    pub(super) index: usize,
    pub(super) layout: Vec<BucketParam>,
    pub(super) error: Option<Vec<f32>>,
    pub(super) q_memory: Option<Vec<f32>>,
}

/// A whole hook's state.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Snapshot {
    pub(super) settings: Settings,
    pub(super) iter: u64,
    pub(super) rng_seed: [u8; 32],
    pub(super) rng_stream: u64,
    pub(super) rng_word_pos: u128,
    /// By bucket index, ascending.
    pub(super) buckets: Vec<BucketState>,
}

impl Snapshot {
    /// The payload of a [`CommHookState`](super::CommHookState).
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut w = Vec::new();
        let s = &self.settings;
        put_u64(&mut w, s.rank);
        put_u64(&mut w, s.start_iter);
        put_u64(&mut w, s.min_compression_rate.to_bits());
        w.push(u8::from(s.warm_start));
        w.push(u8::from(s.error_feedback));
        w.extend_from_slice(&s.orthogonalization_epsilon.to_bits().to_le_bytes());
        put_u64(&mut w, self.iter);
        w.extend_from_slice(&self.rng_seed);
        put_u64(&mut w, self.rng_stream);
        w.extend_from_slice(&self.rng_word_pos.to_le_bytes());
        put_u64(&mut w, self.buckets.len() as u64);
        for b in &self.buckets {
            put_u64(&mut w, b.index as u64);
            put_u64(&mut w, b.layout.len() as u64);
            for p in &b.layout {
                put_u64(&mut w, p.path.len() as u64);
                w.extend_from_slice(p.path.as_bytes());
                put_u64(&mut w, p.offset as u64);
                put_u64(&mut w, p.shape.len() as u64);
                p.shape.iter().for_each(|&d| put_u64(&mut w, d as u64));
            }
            for buffer in [&b.error, &b.q_memory] {
                match buffer {
                    None => w.push(0),
                    Some(values) => {
                        w.push(1);
                        put_u64(&mut w, values.len() as u64);
                        values
                            .iter()
                            .for_each(|v| w.extend_from_slice(&v.to_bits().to_le_bytes()));
                    }
                }
            }
        }
        w
    }

    /// The snapshot [`encode`](Self::encode) wrote; `Err` says what does not decode.
    pub(super) fn decode(bytes: &[u8]) -> Result<Snapshot, String> {
        let mut r = Reader { bytes, at: 0 };
        let settings = Settings {
            rank: r.u64("rank")?,
            start_iter: r.u64("start_iter")?,
            min_compression_rate: f64::from_bits(r.u64("min_compression_rate")?),
            warm_start: r.flag("warm_start")?,
            error_feedback: r.flag("error_feedback")?,
            orthogonalization_epsilon: f32::from_bits(r.u32("orthogonalization_epsilon")?),
        };
        let iter = r.u64("the step count")?;
        let rng_seed = r.array::<32>("the generator's seed")?;
        let rng_stream = r.u64("the generator's stream")?;
        let rng_word_pos = u128::from_le_bytes(r.array::<16>("the generator's position")?);
        let count = r.len("the bucket count", 8)?;
        let mut buckets = Vec::with_capacity(count);
        for _ in 0..count {
            let index = r.usize("a bucket index")?;
            let params = r.len("a bucket's parameter count", 24)?;
            let mut layout = Vec::with_capacity(params);
            for _ in 0..params {
                let len = r.len("a parameter path", 1)?;
                let path = std::str::from_utf8(r.take(len, "a parameter path")?)
                    .map_err(|_| "a parameter path is not UTF-8".to_string())?
                    .to_string();
                let offset = r.usize("a parameter offset")?;
                let dims = r.len("a parameter shape", 8)?;
                let shape = (0..dims)
                    .map(|_| r.usize("a parameter shape"))
                    .collect::<Result<_, _>>()?;
                layout.push(BucketParam {
                    path,
                    shape,
                    offset,
                });
            }
            let error = r.buffer("an error-feedback buffer")?;
            let q_memory = r.buffer("a Q memory")?;
            buckets.push(BucketState {
                index,
                layout,
                error,
                q_memory,
            });
        }
        if r.at != bytes.len() {
            return Err(format!(
                "{} bytes are left after the last bucket",
                bytes.len() - r.at
            ));
        }
        Ok(Snapshot {
            settings,
            iter,
            rng_seed,
            rng_stream,
            rng_word_pos,
            buckets,
        })
    }
}

fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

/// Reads the payload front to back; every error names what was being read.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| format!("truncated in {what} (byte {})", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array::<4>(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array::<8>(what)?))
    }

    fn usize(&mut self, what: &str) -> Result<usize, String> {
        usize::try_from(self.u64(what)?).map_err(|_| format!("{what} does not fit this machine"))
    }

    /// A count of items of at least `item_bytes` bytes each: one the rest cannot hold is
    /// corruption, not an allocation to attempt.
    fn len(&mut self, what: &str, item_bytes: usize) -> Result<usize, String> {
        let n = self.usize(what)?;
        if n.saturating_mul(item_bytes) > self.bytes.len() - self.at {
            return Err(format!("{what} ({n}) is more than the bytes left"));
        }
        Ok(n)
    }

    fn flag(&mut self, what: &str) -> Result<bool, String> {
        match self.take(1, what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(format!("{what} is {other}, not 0 or 1")),
        }
    }

    fn buffer(&mut self, what: &str) -> Result<Option<Vec<f32>>, String> {
        if !self.flag(what)? {
            return Ok(None);
        }
        let n = self.len(what, 4)?;
        let raw = self.take(n * 4, what)?;
        Ok(Some(
            raw.chunks_exact(4)
                .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_round_trips_bit_for_bit_and_truncation_is_named() {
        let snapshot = Snapshot {
            settings: Settings {
                rank: 2,
                start_iter: 3,
                min_compression_rate: 2.0,
                warm_start: true,
                error_feedback: true,
                orthogonalization_epsilon: 1e-8,
            },
            iter: 7,
            rng_seed: [9; 32],
            rng_stream: 4,
            rng_word_pos: 1 << 70,
            buckets: vec![BucketState {
                index: 1,
                layout: vec![BucketParam {
                    path: "fc1.weight".into(),
                    shape: vec![2, 2],
                    offset: 0,
                }],
                error: Some(vec![f32::from_bits(1), -0.0, 1.5, f32::NAN]),
                q_memory: None,
            }],
        };
        let bytes = snapshot.encode();
        let back = Snapshot::decode(&bytes).expect("decodes");
        let bits = |s: &Snapshot| -> Vec<u32> {
            s.buckets[0]
                .error
                .iter()
                .flatten()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(&back), bits(&snapshot));
        assert_eq!(back.encode(), bytes);
        let err = Snapshot::decode(&bytes[..bytes.len() - 2]).unwrap_err();
        assert!(err.contains("an error-feedback buffer"), "{err}");
    }
}
