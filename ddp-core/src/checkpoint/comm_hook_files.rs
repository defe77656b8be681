//! Communication-hook states in checkpoints: every rank's
//! [`TrainingState::comm_hook_state`] (PowerSGD's error feedback is as large as the
//! gradients, and differs per rank) is stored as a binary file of its own,
//! `comm_hook_state-<rank>-of-<world>.bin`, listed in the manifest like every other file and
//! installed with the checkpoint, and given back to the same rank on resume at the same world
//! size. Both checkpoint formats name, encode and decode these files here; a checkpoint without
//! them (older, or a run without a stateful hook) resumes with `None`.

use super::error::{CheckpointError, InvalidReason};
use super::state::TrainingState;
use crate::engine::hooks::CommHookState;
use std::path::Path;

const PREFIX: &str = "comm_hook_state-";
const SUFFIX: &str = ".bin";

/// Rank `rank`'s communication-hook state file in a checkpoint written by `world_size` ranks.
pub fn comm_hook_state_file(rank: usize, world_size: usize) -> String {
    format!("{PREFIX}{rank:05}-of-{world_size:05}{SUFFIX}")
}

/// The rank and world size of a file [`comm_hook_state_file`] named; `None` for any other file.
pub(crate) fn parse_comm_hook_state_file(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let (rank, world) = rest.split_once("-of-")?;
    Some((rank.parse().ok()?, world.parse().ok()?))
}

/// This rank's communication-hook state as the bytes of its file; empty without one.
pub(crate) fn encode_comm_hook_state(state: &TrainingState) -> Vec<u8> {
    state
        .comm_hook_state
        .as_ref()
        .map(CommHookState::to_bytes)
        .unwrap_or_default()
}

/// The state in `bytes`, this rank's file `file` of checkpoint `name` in `dir` (empty: it has
/// none). The file passed its hash check, so one that does not decode was written by another
/// version: [`CheckpointError::Incompatible`].
pub(crate) fn decode_comm_hook_state(
    bytes: &[u8],
    file: &str,
    name: &str,
    dir: &Path,
) -> Result<Option<CommHookState>, CheckpointError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    CommHookState::from_bytes(bytes)
        .map(Some)
        .map_err(|e| CheckpointError::Incompatible {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            reason: Box::new(InvalidReason::BadState {
                file: file.to_string(),
                error: e.to_string(),
            }),
        })
}

/// The warning of a resume at another world size than checkpoint `checkpoint`'s (`saved`)
/// when it holds communication-hook states: they belong to the saved ranks.
pub(crate) fn warn_comm_hook_states_dropped(checkpoint: &str, saved: usize, current: usize) {
    tracing::warn!(
        checkpoint,
        saved,
        current,
        "resuming on a different world size: the saved communication-hook states (PowerSGD's \
         error feedback, per rank) are dropped and the hook starts afresh \
         (Resumed::state.comm_hook_state is None)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_parse_back_and_others_do_not() {
        assert_eq!(
            comm_hook_state_file(1, 2),
            "comm_hook_state-00001-of-00002.bin"
        );
        assert_eq!(
            parse_comm_hook_state_file(&comm_hook_state_file(3, 8)),
            Some((3, 8))
        );
        for other in [
            "model.safetensors",
            "comm_hook_state-x-of-2.bin",
            "comm_hook_state-1.bin",
        ] {
            assert_eq!(parse_comm_hook_state_file(other), None, "{other}");
        }
    }
}
