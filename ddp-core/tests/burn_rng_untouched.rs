//! Construction draws nothing from burn's RNG. In its own test binary: burn's RNG is global to
//! the process, and tests running beside it would draw from it between the seed and the
//! comparison.

#[path = "core/common/mod.rs"]
mod common;

use common::*;
use ddp_core::{DdpConfig, DistributedDataParallel};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn wrapping_a_lazy_model_draws_the_same_initial_weights_as_plain_burn() {
    use burn::tensor::backend::Backend as _;
    let device = Default::default();
    // Plain burn: seed, build (parameters are lazy), first use initialises them in module order.
    B::seed(&device, 11);
    let plain = flat_params(&Mlp::<B>::new(&device, 8));
    let wrapped = run_ranks(1, |pg| {
        B::seed(&device, 11);
        let ddp =
            DistributedDataParallel::new(Mlp::<B>::new(&device, 8), pg, DdpConfig::new()).unwrap();
        flat_params(ddp.module())
    });
    assert_eq!(
        bits(&wrapped[0]),
        bits(&plain),
        "DDP construction changed the model's initial weights (a clone of the lazy model drew \
         values of its own)"
    );
}
