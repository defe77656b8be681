//! The learner types [`DdpStrategy`](crate::DdpStrategy) can drive.

use crate::item::DistributedItem;
use burn::tensor::backend::AutodiffBackend;
use burn_train::{InferenceStep, LearningComponentsTypes, TrainStep};
use ddp_core::TapBackend;

/// The bounds under which [`DdpStrategy`](crate::DdpStrategy) drives a burn-train learner: the step outputs can be
/// merged across ranks.
pub trait DdpComponents:
    LearningComponentsTypes<
        Backend: TapBackend,
        TrainingModel: TrainStep<Output: DistributedItem<Backend = Self::Backend>>,
        InferenceModel: InferenceStep<
            Output: DistributedItem<Backend = <Self::Backend as AutodiffBackend>::InnerBackend>,
        >,
    >
{
}

impl<LC> DdpComponents for LC where
    LC: LearningComponentsTypes<
            Backend: TapBackend,
            TrainingModel: TrainStep<Output: DistributedItem<Backend = LC::Backend>>,
            InferenceModel: InferenceStep<
                Output: DistributedItem<Backend = <LC::Backend as AutodiffBackend>::InnerBackend>,
            >,
        >
{
}
