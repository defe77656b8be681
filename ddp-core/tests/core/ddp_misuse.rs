//! Misuse of the DDP and FSDP wrappers is a clear error that names the rule, on every rank: a
//! plain `loss.backward()` on DDP's output, a backward without forward, a stale forward (from
//! before a backward or an optimizer step), and two wrapped models in one loss graph (a GAN).
use crate::common::*;
use burn::nn::LinearConfig;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::SgdConfig;
use burn::tensor::Tensor;
use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
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

/// One step on `x`, `y`, with a forward after its backward, before its `optimizer_step`
/// (whose output it returns).
fn forward_then_step(
    ddp: &mut DistributedDataParallel<B, Mlp<B>>,
    x: &Tensor<B, 2>,
    y: &Tensor<B, 2>,
) -> Tensor<B, 2> {
    let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
    let pred = ddp.forward(|m| m.forward(x.clone(), false)).unwrap();
    let grads = ddp
        .backward(MseLoss::new().forward(pred, y.clone(), Reduction::Mean))
        .unwrap();
    let early = ddp.forward(|m| m.forward(x.clone(), false)).unwrap();
    ddp.optimizer_step(&mut sgd, 0.1, grads);
    early
}

/// The forward before an `optimizer_step` is stale: its gradients belong to the old weights.
/// A forward discarded before the step does not make the next step's backward fail.
#[test]
fn a_forward_made_before_the_optimizer_step_cannot_be_back_propagated_after_it() {
    for world in [1, 2] {
        let device = Default::default();
        for e in misuse(world, |ddp| {
            let (x, y) = batch(&[0, 1], &device);
            let early = forward_then_step(ddp, &x, &y);
            ddp.backward(MseLoss::new().forward(early, y, Reduction::Mean))
                .unwrap_err()
        }) {
            assert!(
                e.contains("a forward made before the last optimizer_step does not count"),
                "world {world}: {e}"
            );
        }
        // With a forward after the step too, the early one's gradients are named stale.
        for e in misuse(world, |ddp| {
            let (x, y) = batch(&[0, 1], &device);
            let early = forward_then_step(ddp, &x, &y);
            let late = ddp.forward(|m| m.forward(x, false)).unwrap();
            let loss = MseLoss::new().forward(early + late, y, Reduction::Mean);
            ddp.backward(loss).unwrap_err()
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
    // Uneven inputs: a rank that evaluated between its last backward and step may join.
    let answered = run_ranks(2, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let config = DdpConfig::new().with_uneven_inputs(true);
        let mut ddp = DistributedDataParallel::new(Mlp::<B>::new(&device, 8), pg, config).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        for step in 0..2 - rank {
            let (x, y) = batch(&[2 * step + rank], &device);
            let pred = ddp.forward(|m| m.forward(x.clone(), false)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            drop(ddp.forward(|m| m.forward(x, false)).unwrap());
            ddp.optimizer_step(&mut sgd, 0.1, grads);
        }
        ddp.join(&mut sgd, 0.1).unwrap()
    });
    assert_eq!(answered, vec![0, 1]);
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

/// FSDP, like DDP, refuses a stale forward in its backward (its gradients were dropped
/// without a word). Unlike DDP's, its gradients only come from `fsdp.backward`, so a plain
/// `loss.backward()` for input gradients (an adversarial example) and another wrapper's
/// backward through its output (a GAN's generator step) are allowed: only the parameters'
/// gradients are dropped (with a warning), and training goes on on every rank alike.
#[test]
fn fsdp_refuses_a_stale_forward_and_allows_input_gradients_and_a_generator_step() {
    let device = Default::default();
    let units = || FsdpConfig::new().with_units(["fc1", "fc2"]);
    let stale = run_ranks(2, |pg| {
        let model = Mlp::<B>::seeded(&device, 8, 5);
        let mut fsdp = FullyShardedDataParallel::new(model, pg, units()).unwrap();
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
        let loss = old_loss + MseLoss::new().forward(pred, y, Reduction::Mean);
        fsdp.backward(loss).unwrap_err().to_string()
    });
    for e in stale {
        assert!(
            e.contains("made before the previous backward or optimizer_step"),
            "{e}"
        );
    }
    // A DDP generator trained through the FSDP critic's `forward`; the critic's own step
    // follows, after a plain backward that only reads the input's gradient.
    let trained = run_ranks(2, |pg| {
        let rank = pg.rank();
        let generator = Mlp::<B>::seeded(&device, 8, 3);
        let mut g = DistributedDataParallel::new(generator, pg.clone(), DdpConfig::new()).unwrap();
        let critic = Mlp::<B>::seeded(&device, 8, 5);
        let mut d = FullyShardedDataParallel::new(critic, pg, units()).unwrap();
        let mut g_sgd = SgdConfig::new().init::<B, Mlp<B>>();
        let mut d_sgd = SgdConfig::new().init::<B, ShardedParams<B>>();
        for step in 0..2 {
            let (x, y) = batch(&[4 * step + rank, 4 * step + rank + 2], &device);
            let x = x.require_grad();
            let pred = d.forward(|m| m.forward(x.clone(), false)).unwrap();
            let input_grad = MseLoss::new()
                .forward(pred, y.clone(), Reduction::Mean)
                .backward();
            assert!(x.grad(&input_grad).is_some(), "the input's gradient");
            let fake = g.forward(|m| m.forward(x.clone().detach(), false)).unwrap();
            // The critic takes 6 inputs: the 3 generated values twice.
            let fake = Tensor::cat(vec![fake.clone(), fake], 1);
            let score = d.forward(|m| m.forward(fake.clone(), false)).unwrap();
            let grads = g.backward(score.mean().neg()).unwrap();
            g.optimizer_step(&mut g_sgd, 0.05, grads);
            let pred = d.forward(|m| m.forward(x.detach(), false)).unwrap();
            let grads = d
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            d.optimizer_step(&mut d_sgd, 0.05, grads).unwrap();
        }
        (
            flat_params(g.module()),
            flat_params(&d.full_module().unwrap()),
        )
    });
    assert_eq!(bits(&trained[0].0), bits(&trained[1].0));
    assert_eq!(bits(&trained[0].1), bits(&trained[1].1));
    let initial = flat_params(&Mlp::<B>::seeded(&device, 8, 3));
    assert_ne!(
        bits(&trained[0].0),
        bits(&initial),
        "the generator did not train"
    );
}
