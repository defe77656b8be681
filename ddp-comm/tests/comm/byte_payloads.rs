//! Byte payloads of lengths the receivers do not know: `broadcast_bytes` (only the root
//! knows the length), `all_gather_bytes`, `gather_bytes` and `scatter_bytes` (every rank's
//! payload of its own length). Each reaches its ranks whole, from any root, empty included.
use crate::common::*;

#[test]
fn every_rank_gets_the_roots_bytes_whatever_their_length() {
    for world in [1, 3] {
        let results = run_ok(world, |pg| {
            let rank = pg.rank();
            let mut got = Vec::new();
            for root in 0..pg.world_size() {
                // The root's payload: 1000 bytes from rank 0, 1 from rank 1, none from rank 2.
                let len = [1000, 1, 0][root];
                let payload = (0..len).map(|i| (i * 7 + root) as u8).collect();
                // The others pass stale bytes of another length, which must be ignored.
                let mine = if rank == root { payload } else { vec![9; 5] };
                got.push(pg.broadcast_bytes(mine, root)?);
            }
            Ok(got)
        });
        for (rank, got) in results.iter().enumerate() {
            for (root, bytes) in got.iter().enumerate() {
                let len = [1000, 1, 0][root];
                let want: Vec<u8> = (0..len).map(|i| (i * 7 + root) as u8).collect();
                assert_eq!(bytes, &want, "world {world}, rank {rank}, root {root}");
            }
        }
    }
}

#[test]
fn a_root_outside_the_group_is_an_error_on_every_rank() {
    let results = run_world(2, std::time::Duration::from_secs(30), |pg| {
        pg.broadcast_bytes(vec![1, 2, 3], 2)
    });
    for result in results {
        let e = result.expect_err("root 2 of 2 ranks").to_string();
        assert!(e.contains("root"), "{e}");
    }
}

/// Rank `rank`'s payload in the gather tests: lengths 0, 1, 300, 7, ... so that padding to
/// the longest and cutting back are both exercised; `salt` tells rounds apart.
fn payload(rank: usize, salt: usize) -> Vec<u8> {
    let len = [0, 1, 300, 7][rank % 4];
    (0..len).map(|i| (i * 31 + rank * 5 + salt) as u8).collect()
}

#[test]
fn all_gather_bytes_gives_every_rank_every_payload_by_rank() {
    for world in [1, 2, 4] {
        let results = run_ok(world, |pg| {
            let rank = pg.rank();
            let uneven = pg.all_gather_bytes(payload(rank, 0))?;
            let empty = pg.all_gather_bytes(Vec::new())?;
            Ok((uneven, empty))
        });
        let want: Vec<Vec<u8>> = (0..world).map(|r| payload(r, 0)).collect();
        for (rank, (uneven, empty)) in results.iter().enumerate() {
            assert_eq!(uneven, &want, "world {world}, rank {rank}");
            assert_eq!(
                empty,
                &vec![Vec::<u8>::new(); world],
                "world {world}, rank {rank}"
            );
        }
    }
}

#[test]
fn gather_bytes_gives_the_root_alone_every_payload_by_rank() {
    for world in [1, 3, 4] {
        let results = run_ok(world, |pg| {
            let rank = pg.rank();
            (0..pg.world_size())
                .map(|root| pg.gather_bytes(payload(rank, root), root))
                .collect::<Result<Vec<_>, _>>()
        });
        for (rank, got) in results.iter().enumerate() {
            for (root, gathered) in got.iter().enumerate() {
                let want: Option<Vec<Vec<u8>>> =
                    (rank == root).then(|| (0..world).map(|r| payload(r, root)).collect());
                assert_eq!(gathered, &want, "world {world}, rank {rank}, root {root}");
            }
        }
    }
}

#[test]
fn scatter_bytes_gives_each_rank_its_own_payload() {
    for world in [1, 3, 4] {
        let results = run_ok(world, |pg| {
            let rank = pg.rank();
            (0..pg.world_size())
                .map(|root| {
                    let per_rank =
                        (rank == root).then(|| (0..world).map(|r| payload(r, root)).collect());
                    pg.scatter_bytes(per_rank, root)
                })
                .collect::<Result<Vec<_>, _>>()
        });
        for (rank, got) in results.iter().enumerate() {
            for (root, mine) in got.iter().enumerate() {
                assert_eq!(
                    mine,
                    &payload(rank, root),
                    "world {world}, rank {rank}, root {root}"
                );
            }
        }
    }
}

#[test]
fn a_root_with_the_wrong_number_of_payloads_fails_every_rank_without_a_wait() {
    let results = run_world(3, std::time::Duration::from_secs(30), |pg| {
        // Rank 1 is the root and passes two payloads for three ranks; the others pass theirs
        // too, which a non-root's call ignores.
        pg.scatter_bytes(Some(vec![vec![1], vec![2]]), 1)
    });
    for (rank, result) in results.into_iter().enumerate() {
        let e = result
            .expect_err("two payloads for three ranks")
            .to_string();
        assert!(
            e.contains("passed 2 payloads for 3 ranks"),
            "rank {rank}: {e}"
        );
    }
}

#[test]
fn a_gather_root_outside_the_group_is_an_error_on_every_rank() {
    for payload_len in [0, 4] {
        let results = run_world(2, std::time::Duration::from_secs(30), |pg| {
            pg.gather_bytes(vec![7; payload_len], 2)
        });
        for result in results {
            let e = result.expect_err("root 2 of 2 ranks").to_string();
            assert!(
                e.contains("root 2 is outside"),
                "payload {payload_len}: {e}"
            );
        }
    }
}
