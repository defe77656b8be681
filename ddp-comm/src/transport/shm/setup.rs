//! Rendezvous through the store: who shares a host, and the segment each host's ranks map.
//!
//! Keys, in the group's store namespace:
//! - `shm/hello/<group rank>`: the transport the rank asks for and its host id.
//! - `shm/seg/<leader group rank>`: the segment's name, or `!reason` when it could not be
//!   created (the leader is the host's lowest group rank).
//! - `shm/mapped/<group rank>`: `ok` once the rank mapped the segment and registered in its
//!   slot, `-` when it has no segment (alone on its host), `!reason` on failure.
//!
//! Once every rank of a host has reported, the leader unlinks the segment's name: the memory
//! stays mapped for the group's lifetime, and nothing is left under `/dev/shm` however the job
//! ends. Every rank reads every report, so all reach the same decision: hosts where shared
//! memory failed fall back to TCP (`auto`) or fail the group (`shm`).

use super::group::ShmGroup;
use super::host::{ProcId, SEGMENT_PREFIX, SHM_DIR, pid_ns, remove_stale_segments};
use super::patience::Patience;
use super::segment_layout::{HEADER_BYTES, Header, Layout, PAGE};
use super::sys::Segment;
use crate::deadline::deadline_after;
use crate::error::{CommError, Result};
use crate::store::Store;
use crate::transport::{TRANSPORT_ENV, TransportKind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Environment variable setting the staging buffer size in bytes (`K`/`M` suffixes allowed)
/// when the config does not; the leader's value is used, through the segment header.
pub(crate) const BUFFER_ENV: &str = "DDP_SHM_BUFFER_BYTES";
/// Environment variable naming the job in segment names (`ddp-<job id>-...`); without it, a
/// random id agreed through the store.
pub(crate) const JOB_ID_ENV: &str = "DDP_JOB_ID";
/// Default bytes per staging buffer. Measured on a 2-core EPYC (1 MiB L2 per core): 512 KiB
/// runs all-reduce about twice as fast as 1 MiB, and faster than 128 or 256 KiB.
const DEFAULT_CHUNK: usize = 512 << 10;
/// Staging buffers per rank: a pipelined all-reduce fills step `k + 1` while peers still read
/// step `k`, and three buffers let it do so without waiting for step `k - 1`'s readers.
const NBUF: usize = 3;
/// Largest staging buffer: more gains nothing and `/dev/shm` is finite.
const MAX_CHUNK: usize = 256 << 20;

/// What a group needs to set up shared memory.
#[derive(Debug)]
pub(crate) struct SetupSpec<'a> {
    /// The group's store namespace.
    pub(crate) store: &'a Store,
    /// The root namespace of this init of the job (for the job id).
    pub(crate) root_store: &'a Store,
    /// Global rank of each group rank.
    pub(crate) ranks: &'a [usize],
    pub(crate) group_rank: usize,
    pub(crate) group_id: u64,
    pub(crate) timeout: Duration,
    /// What this rank asks for.
    pub(crate) requested: TransportKind,
    /// This rank's host id.
    pub(crate) host_id: String,
    /// Staging buffer size from the config.
    pub(crate) buffer_bytes: Option<usize>,
}

/// The outcome: which group ranks share memory, and this rank's segment.
#[derive(Debug)]
pub(crate) struct Topology {
    /// Group ranks in units that share a segment (a host), ascending, ordered by their first
    /// rank. A rank alone in its unit talks TCP only.
    pub(crate) units: Vec<Vec<usize>>,
    /// This rank's unit's shared memory, when the unit has more than one rank.
    pub(crate) shm: Option<ShmGroup>,
}

impl Topology {
    fn singletons(n: usize) -> Topology {
        Topology {
            units: (0..n).map(|r| vec![r]).collect(),
            shm: None,
        }
    }
}

/// Meets the group's other ranks through the store and maps this host's segment.
///
/// # Errors
/// Store failures and timeouts; ranks that ask for `tcp` and `shm` at once; shared memory that
/// cannot be set up where a rank asked for `shm`.
pub(crate) fn setup(spec: &SetupSpec<'_>) -> Result<Topology> {
    let n = spec.ranks.len();
    let me = spec.group_rank;
    let deadline = deadline_after(spec.timeout);
    let get = |key: String| -> Result<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        Ok(String::from_utf8_lossy(&spec.store.get_timeout(&key, left)?).into_owned())
    };
    if n == 1 {
        return Ok(Topology::singletons(1));
    }
    let chunk = requested_chunk(spec.buffer_bytes)?;
    let patience = Patience::from_env()?;
    spec.store.set(
        &format!("shm/hello/{me}"),
        format!("{}\n{}", spec.requested, spec.host_id).as_bytes(),
    )?;
    let mut hellos = Vec::with_capacity(n);
    for r in 0..n {
        let text = get(format!("shm/hello/{r}"))?;
        let (kind, host) = text.split_once('\n').unwrap_or((&text, ""));
        hellos.push((kind.parse::<TransportKind>()?, host.to_string()));
    }
    let asking = |k: TransportKind| hellos.iter().position(|h| h.0 == k);
    let required = asking(TransportKind::Shm);
    if let Some(t) = asking(TransportKind::Tcp) {
        if let Some(s) = required {
            return Err(CommError::config(
                TRANSPORT_ENV,
                format!(
                    "rank {} asked for tcp but rank {} for shm (every rank of a group must agree)",
                    spec.ranks[t], spec.ranks[s]
                ),
            ));
        }
        return Ok(Topology::singletons(n));
    }

    // Hosts, in order of their first group rank.
    let mut hosts: Vec<(String, Vec<usize>)> = Vec::new();
    for (r, (_, host)) in hellos.iter().enumerate() {
        match hosts.iter_mut().find(|h| h.0 == *host) {
            Some(h) => h.1.push(r),
            None => hosts.push((host.clone(), vec![r])),
        }
    }
    let local = hosts
        .iter()
        .find(|h| h.1.contains(&me))
        .map(|h| h.1.clone())
        .unwrap_or_default();
    let my_slot = local.iter().position(|&r| r == me).unwrap_or(0);
    let leader = local[0];

    let mut mapped: Option<(Segment, Layout)> = None;
    let mut created = Unlink(None);
    let status = if local.len() < 2 {
        "-".to_string()
    } else {
        let attempt = if me == leader {
            // The unlink guard holds the name from the moment it exists, so that no error
            // below (the store set) leaves the segment behind in /dev/shm.
            let outcome = create(spec, local.len(), chunk).map(|(seg, layout, path)| {
                let name = path
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default();
                created.0 = Some(path);
                (seg, layout, name)
            });
            let published = match &outcome {
                Ok((_, _, name)) => name.clone(),
                Err(reason) => format!("!{reason}"),
            };
            spec.store
                .set(&format!("shm/seg/{leader}"), published.as_bytes())?;
            outcome.map(|(seg, layout, _)| (seg, layout))
        } else {
            let name = get(format!("shm/seg/{leader}"))?;
            match name.strip_prefix('!') {
                Some(reason) => Err(format!(
                    "rank {} could not create the segment: {reason}",
                    spec.ranks[leader]
                )),
                None => open(&name, local.len()),
            }
        };
        match attempt {
            Ok((seg, layout)) => {
                ShmGroup::register(&seg, &layout, my_slot);
                mapped = Some((seg, layout));
                "ok".to_string()
            }
            Err(reason) => format!("!{reason}"),
        }
    };
    spec.store
        .set(&format!("shm/mapped/{me}"), status.as_bytes())?;

    // Local reports first, so the leader can unlink the name as early as possible.
    let mut reports: Vec<Option<String>> = vec![None; n];
    for &r in &local {
        reports[r] = Some(get(format!("shm/mapped/{r}"))?);
    }
    drop(created);
    for (r, report) in reports.iter_mut().enumerate() {
        if report.is_none() {
            *report = Some(get(format!("shm/mapped/{r}"))?);
        }
    }
    let reports: Vec<String> = reports.into_iter().map(Option::unwrap_or_default).collect();

    let mut units: Vec<Vec<usize>> = Vec::new();
    for (_, members) in &hosts {
        let failed = members
            .iter()
            .find_map(|&r| reports[r].strip_prefix('!').map(|why| (r, why)));
        match failed {
            None => units.push(members.clone()),
            Some((r, why)) => {
                let globals: Vec<usize> = members.iter().map(|&m| spec.ranks[m]).collect();
                let what = format!(
                    "shared memory between ranks {globals:?} could not be set up: rank {}: {why}",
                    spec.ranks[r]
                );
                if required.is_some() {
                    return Err(CommError::config(
                        TRANSPORT_ENV,
                        format!("{what} (set {TRANSPORT_ENV}=tcp or auto)"),
                    ));
                }
                tracing::warn!("{what}; these ranks use TCP");
                units.extend(members.iter().map(|&m| vec![m]));
            }
        }
    }
    units.sort_by_key(|u| u[0]);
    let mine = units
        .iter()
        .find(|u| u.contains(&me))
        .cloned()
        .unwrap_or_default();
    let shm = match mapped {
        Some((seg, layout)) if mine.len() > 1 => {
            let globals = mine.iter().map(|&r| spec.ranks[r]).collect();
            Some(ShmGroup::new(
                seg,
                layout,
                my_slot,
                globals,
                spec.timeout,
                patience,
            ))
        }
        _ => None,
    };
    Ok(Topology { units, shm })
}

/// Unlinks a segment's name when dropped: after every local rank has mapped it, or on any
/// early return of the setup.
struct Unlink(Option<PathBuf>);

impl Drop for Unlink {
    fn drop(&mut self) {
        if let Some(path) = self.0.take()
            && let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(segment = %path.display(), error = %e, "could not unlink a shared-memory segment");
        }
    }
}

/// The staging buffer size asked for: the config's, else [`BUFFER_ENV`], else the default.
///
/// # Errors
/// [`BUFFER_ENV`] is set to something that is not a size: a config error on every rank that
/// has it, rather than a silent fallback on one.
fn requested_chunk(configured: Option<usize>) -> Result<usize> {
    match configured {
        Some(bytes) => Ok(bytes),
        None => match crate::env::env_var(BUFFER_ENV)? {
            Some(v) => parse_bytes(&v).map_err(|reason| CommError::config(BUFFER_ENV, reason)),
            None => Ok(DEFAULT_CHUNK),
        },
    }
}

/// The staging buffer size used: whole pages, at most [`MAX_CHUNK`], large enough for every
/// rank's part of a reduce-scatter step.
fn chunk_bytes(asked: usize, local: usize) -> usize {
    asked
        .clamp(PAGE, MAX_CHUNK)
        .max(local.saturating_mul(64).min(MAX_CHUNK))
        .next_multiple_of(PAGE)
}

/// Parses a byte count with an optional `K` or `M` suffix (binary units); never overflows.
pub(crate) fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim().to_ascii_uppercase();
    let (num, shift) = match t.as_bytes().last() {
        Some(b'K') => (&t[..t.len() - 1], 10),
        Some(b'M') => (&t[..t.len() - 1], 20),
        _ => (&t[..], 0),
    };
    let v = num
        .parse::<usize>()
        .map_err(|_| format!("'{s}' is not a byte count (e.g. 4096, 64K, 2M)"))?;
    v.checked_mul(1 << shift)
        .ok_or_else(|| format!("'{s}' is more bytes than this machine can address"))
}

/// The job id in segment names: [`JOB_ID_ENV`], or one random id per job agreed through the
/// root store. Only `[A-Za-z0-9_]`, at most 32 characters.
fn job_id(root_store: &Store) -> Result<String> {
    let clean = |s: &str| {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(32)
            .collect::<String>()
    };
    if let Some(v) = crate::env::env_var(JOB_ID_ENV)? {
        let v = clean(&v);
        if !v.is_empty() {
            return Ok(v);
        }
    }
    let candidate = format!("{:016x}", rand::random::<u64>());
    let agreed = root_store.compare_set("shm/job_id", b"", candidate.as_bytes())?;
    Ok(clean(&String::from_utf8_lossy(&agreed)))
}

/// The leader's part: clears stale segments, creates and maps a new one.
fn create(
    spec: &SetupSpec<'_>,
    local: usize,
    chunk: usize,
) -> Result<(Segment, Layout, PathBuf), String> {
    let layout = Layout {
        local,
        nbuf: NBUF,
        chunk: chunk_bytes(chunk, local),
    };
    let dir = Path::new(SHM_DIR);
    remove_stale_segments(dir);
    let job = job_id(spec.root_store).map_err(|e| e.to_string())?;
    let name = format!(
        "{SEGMENT_PREFIX}{job}-{:016x}-{:08x}",
        spec.group_id,
        rand::random::<u32>()
    );
    let path = dir.join(&name);
    let me = ProcId::me();
    let header = Header {
        layout,
        pid: me.pid,
        start: me.start,
        pid_ns: pid_ns(),
    };
    match Segment::create(&path, layout.total_bytes(), &header.encode()) {
        Ok(seg) => {
            tracing::debug!(segment = %path.display(), bytes = layout.total_bytes(), "created a shared-memory segment");
            Ok((seg, layout, path))
        }
        Err(e) => {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                let _ = std::fs::remove_file(&path);
            }
            Err(format!(
                "creating {} ({} bytes): {e}",
                path.display(),
                layout.total_bytes()
            ))
        }
    }
}

/// A follower's part: maps the leader's segment and checks that it is what we expect.
fn open(name: &str, local: usize) -> Result<(Segment, Layout), String> {
    if name.contains('/') || !name.starts_with(SEGMENT_PREFIX) {
        return Err(format!("'{name}' is not a segment name"));
    }
    let path = Path::new(SHM_DIR).join(name);
    let seg = Segment::open(&path).map_err(|e| {
        format!(
            "opening {}: {e} (do these ranks really share /dev/shm? set {TRANSPORT_ENV}=tcp to avoid it)",
            path.display()
        )
    })?;
    let mut head = [0u8; HEADER_BYTES];
    if seg.len() >= HEADER_BYTES {
        seg.read(0, &mut head);
    }
    match Header::decode(&head) {
        Some(h) if h.layout.local == local && h.layout.total_bytes() == seg.len() => {
            Ok((seg, h.layout))
        }
        _ => Err(format!(
            "{} is not a segment for {local} ranks",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_size_is_whole_pages_and_parses_suffixes() {
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes(" 2m "), Ok(2 << 20));
        assert_eq!(parse_bytes("5000"), Ok(5000));
        assert!(parse_bytes("x").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("K").is_err());
        assert_eq!(chunk_bytes(5000, 2), 2 * PAGE);
        assert_eq!(chunk_bytes(1, 2), PAGE);
        assert!(chunk_bytes(PAGE, 4096) >= 4096 * 64);
        assert_eq!(chunk_bytes(usize::MAX, usize::MAX), MAX_CHUNK);
    }

    #[test]
    fn sizes_that_overflow_are_errors_not_panics() {
        let max_k = (usize::MAX >> 10).to_string();
        assert_eq!(
            parse_bytes(&format!("{max_k}K")),
            Ok((usize::MAX >> 10) << 10)
        );
        for text in [
            format!("{}K", (usize::MAX >> 10) + 1),
            format!("{}M", usize::MAX >> 19),
            "18446744073709551615M".to_string(),
            "99999999999999999999999".to_string(),
        ] {
            let e = parse_bytes(&text).expect_err(&text);
            assert!(e.contains(&text), "{e}");
        }
    }

    mod properties {
        use super::super::*;
        use crate::proptest_support::config;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(config())]

            /// Any text is a size or an error, never an overflow panic; a number with a suffix
            /// is exactly that many bytes when it fits.
            #[test]
            fn any_size_parses_safely(text in "\\PC{0,24}", n in any::<u64>(), suffix in prop_oneof![Just(""), Just("k"), Just("K"), Just("M"), Just("m")]) {
                let _ = parse_bytes(&text);
                let shift = match suffix { "k" | "K" => 10, "m" | "M" => 20, _ => 0 };
                let expected = usize::try_from(n).ok().and_then(|n| n.checked_mul(1 << shift));
                prop_assert_eq!(parse_bytes(&format!("{n}{suffix}")).ok(), expected);
            }

            #[test]
            fn any_chunk_request_is_whole_pages_within_bounds(asked in any::<usize>(), local in any::<usize>()) {
                let c = chunk_bytes(asked, local);
                prop_assert!(c.is_multiple_of(PAGE) && (PAGE..=MAX_CHUNK).contains(&c));
            }
        }
    }
}
