//! The NCCL unique id: rank 0 creates it and publishes its bytes in the store; the other ranks
//! wait for them. NCCL uses the id to find rank 0's bootstrap socket, so every rank of a
//! communicator must hold the same one.

use crate::error::NcclError;
use crate::error::{CommError, Result};
use crate::store::Store;
use cudarc::nccl::Id;
use std::ffi::c_char;

/// Size of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub(crate) const ID_BYTES: usize = 128;

/// The store key of a group's id. It includes the group name so that several NCCL groups can
/// meet through one store.
pub(crate) fn key(group: &str) -> String {
    format!("nccl/{group}/unique_id")
}

/// The id's bytes as they travel through the store.
pub(crate) fn encode(id: &Id) -> Vec<u8> {
    // `c_char` is `i8` on x86-64 and `u8` on aarch64: go through the byte representation so the
    // wire format is the same everywhere.
    id.internal()
        .iter()
        .map(|c| u8::from_ne_bytes(c.to_ne_bytes()))
        .collect()
}

/// Rebuilds an id from the bytes [`encode`] produced; `key` names where they came from.
pub(crate) fn decode(bytes: &[u8], key: &str) -> std::result::Result<Id, NcclError> {
    let raw: [u8; ID_BYTES] = bytes.try_into().map_err(|_| NcclError::BadUniqueId {
        key: key.to_string(),
        len_bytes: bytes.len(),
        expected: ID_BYTES,
    })?;
    Ok(Id::uninit(raw.map(|b| c_char::from_ne_bytes([b]))))
}

/// Rank 0 calls `create` and publishes the id under [`key`]; the other ranks wait for it with
/// the store's timeout.
///
/// # Errors
/// Rank 0: `create`'s error, or [`NcclError::NameInUse`] if the key is already set (a stale id
/// from an earlier group would make the ranks join different communicators and hang). Others:
/// [`CommError::StoreTimeout`] naming the key if rank 0 does not publish in time,
/// [`NcclError::BadUniqueId`] if the value is not an id.
pub(crate) fn exchange(
    store: &Store,
    group: &str,
    rank: usize,
    create: impl FnOnce() -> Result<Id>,
) -> Result<Id> {
    let key = key(group);
    if rank == 0 {
        let id = create()?;
        let bytes = encode(&id);
        // compare_set with an empty `expected` only sets a missing key, atomically.
        let stored = store.compare_set(&key, b"", &bytes)?;
        if stored != bytes {
            return Err(NcclError::NameInUse { key }.into());
        }
        tracing::debug!(%key, "published the NCCL unique id");
        Ok(id)
    } else {
        tracing::debug!(%key, timeout = ?store.timeout(), "waiting for rank 0's NCCL unique id");
        let bytes = store.get(&key)?;
        decode(&bytes, &key).map_err(CommError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreConfig, StoreServer};
    use std::time::Duration;

    /// A recognisable id, as `Id::new` would make (real ids are random, so two differ).
    fn pattern_with(seed: usize) -> Id {
        // Bytes above 127 are included: they are negative as an `i8` `c_char`.
        let bytes: Vec<u8> = (0..ID_BYTES).map(|i| (i * 2 + seed) as u8).collect();
        decode(&bytes, "test").expect("128 bytes decode")
    }

    fn pattern() -> Id {
        pattern_with(1)
    }

    #[test]
    fn id_bytes_round_trip() {
        let bytes: Vec<u8> = (0..ID_BYTES).map(|i| (255 - i) as u8).collect();
        let id = decode(&bytes, "k").expect("128 bytes decode");
        assert_eq!(encode(&id), bytes);
        assert_eq!(
            decode(&encode(&id), "k").expect("round trip").internal(),
            id.internal()
        );
    }

    #[test]
    fn wrong_length_is_named_with_its_key() {
        let e = decode(&[1, 2, 3], "nccl/g/unique_id").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("'nccl/g/unique_id' holds 3 bytes"), "{msg}");
    }

    #[test]
    fn ranks_receive_rank_zero_id_under_the_group_key() {
        let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("bind");
        let addr = server.local_addr().to_string();
        let config = StoreConfig::new().with_timeout(Duration::from_secs(10));
        let ids: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let (addr, config) = (addr.clone(), config.clone());
                    s.spawn(move || {
                        let store = Store::connect(&addr, config).expect("connect");
                        let id = exchange(&store, "g1", rank, || Ok(pattern())).expect("exchange");
                        encode(&id)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank"))
                .collect()
        });
        assert!(ids.iter().all(|id| *id == encode(&pattern())));
        // Another group name is another key: it does not collide.
        let store = Store::connect(&addr, config).expect("connect");
        exchange(&store, "g2", 0, || Ok(pattern())).expect("second group");
        assert!(store.check(&[&key("g1"), &key("g2")]).expect("check"));
    }

    #[test]
    fn reusing_a_group_name_is_refused() {
        let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("bind");
        let store =
            Store::connect(&server.local_addr().to_string(), StoreConfig::new()).expect("connect");
        exchange(&store, "same", 0, || Ok(pattern_with(1))).expect("first");
        let e = exchange(&store, "same", 0, || Ok(pattern_with(2))).unwrap_err();
        assert!(
            matches!(e, CommError::Nccl(NcclError::NameInUse { .. })),
            "{e}"
        );
    }

    #[test]
    fn waiting_rank_times_out_naming_the_key() {
        let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("bind");
        let config = StoreConfig::new().with_timeout(Duration::from_millis(200));
        let store = Store::connect(&server.local_addr().to_string(), config).expect("connect");
        let e = exchange(&store, "lonely", 1, || unreachable!("only rank 0 creates")).unwrap_err();
        assert!(e.to_string().contains("nccl/lonely/unique_id"), "{e}");
    }

    mod properties {
        use super::super::*;
        use crate::proptest_support::config;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(config())]

            /// Whatever a store holds under the key, it is an id exactly when it has 128 bytes,
            /// which then encode back unchanged; anything else is an error naming its length.
            #[test]
            fn any_stored_value_decodes_safely(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
                match decode(&bytes, "k") {
                    Ok(id) => prop_assert_eq!(encode(&id), bytes),
                    Err(e) => {
                        prop_assert!(bytes.len() != ID_BYTES);
                        prop_assert!(e.to_string().contains(&bytes.len().to_string()));
                    }
                }
            }
        }
    }
}
