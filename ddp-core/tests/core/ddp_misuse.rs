//! Misuse of the DDP and FSDP wrappers is a clear error that names the rule, on every rank: a
//! plain `loss.backward()`, a backward without forward, a stale forward (from before a backward
//! or an optimizer step), and two wrapped models in one loss graph (a GAN).
use crate::common::*;
use burn::nn::LinearConfig;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::SgdConfig;
use burn::tensor::Tensor;
use ddp_core::comm::ProcessGroup;
use ddp_core::fsdp::{FsdpConfig, FsdpError, FullyShardedDataParallel, ShardedParams};
use ddp_core::{DdpConfig, DdpError, DistributedDataParallel};

fn misuse(
    world: usize,
    body: impl Fn(&mut DistributedDataParallel<B, Mlp<B>>) -> DdpError + Sync,
) -> Vec<String> {
    run_ranks(world, |pg| {
        let device = Default::default();
        let mut ddp =
            DistributedDataParallel::new(Mlp::<B>::new(&device, 8), pg, DdpConfig::new()).unwrap();
        body(&mut ddp).to_string()
    })
}

#[test]
fn misuse_is_a_clear_error_naming_the_rule() {
    for world in [1, 2] {
        let device = Default::default();
        // A plain `loss.backward()` on DDP's output.
        for e in misuse(world, |ddp| {
            let (x, y) = batch(&[0, 1], &device);
            let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
            drop(MseLoss::new().forward(pred, y, Reduction::Mean).backward());
            ddp.forward(|m| m.fc1.weight.val()).unwrap_err()
        }) {
            assert!(
                e.contains("instead of `loss.backward()`"),
                "world {world}: {e}"
            );
        }
        // Backward without forward.
        for e in misuse(world, |ddp| {
            ddp.backward(Tensor::<B, 1>::ones([1], &device).require_grad())
                .unwrap_err()
        }) {
            assert!(e.contains("backward without forward"), "world {world}: {e}");
        }
        // A loss from a forward that an earlier backward consumed.
        for e in misuse(world, |ddp| {
            let (x, y) = batch(&[0, 1], &device);
            let old = ddp.forward(|m| m.forward(x.clone(), false)).unwrap();
            let old_loss = MseLoss::new().forward(old, y.clone(), Reduction::Mean);
            let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
            ddp.backward(MseLoss::new().forward(pred, y.clone(), Reduction::Mean))
                .unwrap();
            let (x2, y2) = batch(&[2], &device);
            let pred = ddp.forward(|m| m.forward(x2, false)).unwrap();
            let stale = old_loss + MseLoss::new().forward(pred, y2, Reduction::Mean);
            ddp.backward(stale).unwrap_err()
        }) {
            assert!(
                e.contains("comes from a forward made before the previous backward"),
                "world {world}: {e}"
            );
        }
    }
}

/// The forward before an `optimizer_step` is stale: its gradients belong to the old weights.
/// A forward discarded before the step does not make the next step's backward fail.
#[test]
fn a_forward_made_before_the_optimizer_step_cannot_be_back_propagated_after_it() {
    for world in [1, 2] {
        let device = Default::default();
        for e in misuse(world, |ddp| {
            let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
            let (x, y) = batch(&[0, 1], &device);
            let pred = ddp.forward(|m| m.forward(x.clone(), false)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y.clone(), Reduction::Mean))
                .unwrap();
            let early = ddp.forward(|m| m.forward(x, false)).unwrap();
            ddp.optimizer_step(&mut sgd, 0.1, grads);
            ddp.backward(MseLoss::new().forward(early, y, Reduction::Mean))
                .unwrap_err()
        }) {
            assert!(
                e.contains("made before the previous backward or optimizer_step"),
                "world {world}: {e}"
            );
        }
        let losses = run_ranks(world, |pg| {
            let mut ddp =
                DistributedDataParallel::new(Mlp::<B>::new(&device, 8), pg, DdpConfig::new())
                    .unwrap();
            let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
            let (x, y) = batch(&[0, 1], &device);
            let mut losses = Vec::new();
            for _ in 0..2 {
                let pred = ddp.forward(|m| m.forward(x.clone(), false)).unwrap();
                let loss = MseLoss::new().forward(pred, y.clone(), Reduction::Mean);
                losses.push(loss.clone().into_scalar());
                let grads = ddp.backward(loss).unwrap();
                drop(ddp.forward(|m| m.forward(x.clone(), false)).unwrap());
                ddp.optimizer_step(&mut sgd, 0.1, grads);
            }
            losses
        });
        for l in &losses {
            assert!(l[1] < l[0], "world {world}: the step did not train: {l:?}");
        }
    }
}

/// A GAN's generator loss through the wrapped discriminator's `forward`: the discriminator's
/// taps fire during the generator's backward. Its next call names that, not a plain
/// `loss.backward()`; the fix it names (the loss through `d.module()`) trains both models, with
/// replicas that stay bitwise equal.
#[test]
fn a_generator_loss_through_a_wrapped_discriminator_is_an_error_naming_the_fix() {
    let device = Default::default();
    let gan = |through_module: bool| {
        run_ranks(2, move |pg| {
            let rank = pg.rank();
            let config = DdpConfig::new();
            let generator = Mlp::<B>::seeded(&device, 8, 3);
            let mut g = DistributedDataParallel::new(generator, pg.clone(), config.clone())?;
            let critic = LinearConfig::new(3, 1).init::<B>(&device);
            let mut d = DistributedDataParallel::new(critic, pg.clone(), config)?;
            let (mut g_sgd, mut d_sgd) = (SgdConfig::new().init(), SgdConfig::new().init());
            for step in 0..2 {
                let (x, real) = batch(&[4 * step + rank, 4 * step + rank + 2], &device);
                // The discriminator's step: real samples up, generated ones (detached) down.
                let fake = g.forward(|m| m.forward(x.clone(), false))?;
                let real_score = d.forward(|m| m.forward(real))?;
                let fake_score = d.forward(|m| m.forward(fake.clone().detach()))?;
                let grads = d.backward(fake_score.mean() - real_score.mean())?;
                d.optimizer_step(&mut d_sgd, 0.05, grads);
                // The generator's step: its output scored by the discriminator.
                let score = if through_module {
                    d.module().forward(fake)
                } else {
                    d.forward(|m| m.forward(fake))?
                };
                let grads = g.backward(score.mean().neg())?;
                g.optimizer_step(&mut g_sgd, 0.05, grads);
                pg.barrier().expect("barrier");
            }
            Ok::<_, DdpError>(flat_params(g.module()))
        })
    };
    for (rank, outcome) in gan(false).into_iter().enumerate() {
        let e = outcome.expect_err("the wrapped discriminator's taps fired outside its backward");
        assert!(
            e.to_string()
                .contains("during another DDP or FSDP wrapper's backward"),
            "rank {rank}: {e}"
        );
    }
    let trained: Vec<Vec<f32>> = gan(true).into_iter().map(Result::unwrap).collect();
    assert_eq!(bits(&trained[0]), bits(&trained[1]));
    let initial = flat_params(&Mlp::<B>::seeded(&device, 8, 3));
    assert_ne!(
        bits(&trained[0]),
        bits(&initial),
        "the generator did not train"
    );
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One misuse of an FSDP-wrapped [`Mlp`] on one rank: the error it ends in.
type FsdpBody<'a> =
    dyn Fn(&mut FullyShardedDataParallel<B, Mlp<B>>, ProcessGroup) -> FsdpError + Sync + 'a;

/// FSDP as DDP: a plain `loss.backward()` on its output, a stale forward in its backward, and
/// another wrapper's backward through its output are errors naming the rule (they were dropped
/// without a word).
#[test]
fn fsdp_misuse_is_a_clear_error_naming_the_rule() {
    let device = Default::default();
    let units = || FsdpConfig::new().with_units(["fc1", "fc2"]);
    let fsdp_misuse = |body: &FsdpBody<'_>| {
        run_ranks(2, |pg| {
            let model = Mlp::<B>::seeded(&device, 8, 5);
            let mut fsdp = FullyShardedDataParallel::new(model, pg.clone(), units()).unwrap();
            body(&mut fsdp, pg).to_string()
        })
    };
    for e in fsdp_misuse(&|fsdp, _| {
        let (x, y) = batch(&[0, 1], &device);
        let pred = fsdp.forward(|m| m.forward(x.clone(), false)).unwrap();
        drop(MseLoss::new().forward(pred, y, Reduction::Mean).backward());
        fsdp.forward(|m| m.forward(x, false)).unwrap_err()
    }) {
        assert!(e.contains("instead of `loss.backward()`"), "{e}");
    }
    for e in fsdp_misuse(&|fsdp, _| {
        let mut sgd = SgdConfig::new().init::<B, ShardedParams<B>>();
        let (x, y) = batch(&[0, 1], &device);
        let pred = fsdp.forward(|m| m.forward(x.clone(), false)).unwrap();
        let old_loss = MseLoss::new().forward(pred, y.clone(), Reduction::Mean);
        let pred = fsdp.forward(|m| m.forward(x.clone(), false)).unwrap();
        let grads = fsdp
            .backward(MseLoss::new().forward(pred, y.clone(), Reduction::Mean))
            .unwrap();
        fsdp.optimizer_step(&mut sgd, 0.1, grads).unwrap();
        let pred = fsdp.forward(|m| m.forward(x, false)).unwrap();
        let stale = old_loss + MseLoss::new().forward(pred, y, Reduction::Mean);
        fsdp.backward(stale).unwrap_err()
    }) {
        assert!(
            e.contains("made before the previous backward or optimizer_step"),
            "{e}"
        );
    }
    // A DDP generator whose loss goes through the FSDP discriminator's `forward`.
    for e in fsdp_misuse(&|critic, pg| {
        let mut g =
            DistributedDataParallel::new(Mlp::<B>::seeded(&device, 8, 3), pg, DdpConfig::new())
                .unwrap();
        let (x, _) = batch(&[0, 1], &device);
        let fake = g.forward(|m| m.forward(x.clone(), false)).unwrap();
        // The critic is an Mlp too: 6 inputs, so the 3 generated values are padded twice.
        let fake = Tensor::cat(vec![fake.clone(), fake], 1);
        let score = critic.forward(|m| m.forward(fake, false)).unwrap();
        g.backward(score.mean()).unwrap();
        critic.forward(|m| m.forward(x, false)).unwrap_err()
    }) {
        assert!(
            e.contains("during another DDP or FSDP wrapper's backward"),
            "{e}"
        );
    }
}
