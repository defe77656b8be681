//! `broadcast_bytes`: a payload whose length only the root knows reaches every rank whole,
//! from any root, empty included, whatever the other ranks passed in.
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
