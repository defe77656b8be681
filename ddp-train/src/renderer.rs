//! Rank 0's renderer: burn-train's progress and metrics shown the way every ddp-burn job shows
//! progress, so a job started by the launcher gets one live bar above its workers' output.

use burn_train::LearnerSummary;
use burn_train::metric::{MetricDefinition, MetricId};
use burn_train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use ddp_core::progress::ProgressDisplay;
use std::collections::{BTreeMap, HashMap};

/// The phase a bar belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    Train,
    Valid,
    Test,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Train => "train",
            Phase::Valid => "valid",
            Phase::Test => "test",
        }
    }
}

/// burn-train's [`MetricsRenderer`] for rank 0 of a distributed run: one bar per epoch and
/// phase (`train epoch 2/10`, then `valid epoch 2/10`) with the latest value of each metric
/// beside it, drawn through [`ProgressDisplay`]. Under the launcher the bar is the
/// launcher's (it draws it above the workers' output); on a terminal rank 0 draws it; in a file
/// or pipe it becomes a line every few seconds. At the end it prints burn-train's summary.
///
/// [`distributed`](crate::DistributedTrainingExt::distributed) installs it on rank 0 (and
/// [`SilentRenderer`](crate::SilentRenderer) on the others); call `.renderer(...)` after
/// `.distributed(...)` to use another one.
#[derive(Debug, Default)]
pub struct ProgressRenderer {
    names: HashMap<MetricId, String>,
    latest: HashMap<Phase, BTreeMap<String, String>>,
    bar: Option<(Phase, usize, ProgressDisplay)>,
}

impl ProgressRenderer {
    /// A renderer with no bar yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn update(&mut self, phase: Phase, state: MetricState) {
        let entry = match state {
            MetricState::Generic(entry) | MetricState::Numeric(entry, _) => entry,
        };
        let name = self
            .names
            .get(&entry.metric_id)
            .cloned()
            .unwrap_or_else(|| format!("{:?}", entry.metric_id));
        self.latest
            .entry(phase)
            .or_default()
            .insert(name, entry.serialized_entry.formatted);
    }

    /// Moves the bar of `phase` in `epoch` of `epochs` to `done` of `total` items, starting a
    /// new bar when the phase or epoch changed.
    fn render(&mut self, phase: Phase, epoch: usize, epochs: usize, done: usize, total: usize) {
        let current = matches!(&self.bar, Some((p, e, _)) if *p == phase && *e == epoch);
        if !current {
            if let Some((_, _, bar)) = self.bar.take() {
                bar.finish();
            }
            let label = if epochs > 0 {
                format!("{} epoch {epoch}/{epochs}", phase.name())
            } else {
                phase.name().to_string()
            };
            self.bar = Some((phase, epoch, ProgressDisplay::begin(label, total as u64)));
        }
        let message = self
            .latest
            .get(&phase)
            .map(|metrics| {
                metrics
                    .iter()
                    .map(|(name, value)| format!("{name} {value}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        if let Some((_, _, bar)) = &mut self.bar {
            bar.position(done as u64, &message);
        }
    }

    fn render_training(&mut self, phase: Phase, item: TrainingProgress) {
        let (done, total) = item
            .progress
            .map_or((0, 0), |p| (p.items_processed, p.items_total));
        let global = item.global_progress;
        self.render(
            phase,
            global.items_processed,
            global.items_total,
            done,
            total,
        );
    }

    fn end(&mut self, summary: Option<LearnerSummary>) {
        if let Some((_, _, bar)) = self.bar.take() {
            bar.finish();
        }
        if let Some(summary) = summary {
            println!("{summary}");
        }
    }
}

impl MetricsRendererTraining for ProgressRenderer {
    fn update_train(&mut self, state: MetricState) {
        self.update(Phase::Train, state);
    }
    fn update_valid(&mut self, state: MetricState) {
        self.update(Phase::Valid, state);
    }
    fn render_train(&mut self, item: TrainingProgress, _progress: Vec<ProgressType>) {
        self.render_training(Phase::Train, item);
    }
    fn render_valid(&mut self, item: TrainingProgress, _progress: Vec<ProgressType>) {
        self.render_training(Phase::Valid, item);
    }
    fn on_train_end(
        &mut self,
        summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        self.end(summary);
        Ok(())
    }
}

impl MetricsRendererEvaluation for ProgressRenderer {
    fn update_test(&mut self, _name: EvaluationName, state: MetricState) {
        self.update(Phase::Test, state);
    }
    fn render_test(&mut self, item: EvaluationProgress, _progress: Vec<ProgressType>) {
        let p = item.progress;
        self.render(Phase::Test, 0, 0, p.items_processed, p.items_total);
    }
    fn on_test_end(
        &mut self,
        summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        self.end(summary);
        Ok(())
    }
}

impl MetricsRenderer for ProgressRenderer {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names.insert(definition.metric_id, definition.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::data::dataloader::Progress;

    fn item(epoch: usize, done: usize) -> TrainingProgress {
        TrainingProgress {
            progress: Some(Progress {
                items_processed: done,
                items_total: 40,
            }),
            global_progress: Progress {
                items_processed: epoch,
                items_total: 3,
            },
            iteration: None,
        }
    }

    #[test]
    fn a_new_bar_starts_for_each_phase_and_epoch() {
        let mut r = ProgressRenderer::new();
        r.render_train(item(1, 8), vec![]);
        r.render_train(item(1, 16), vec![]);
        assert!(matches!(r.bar, Some((Phase::Train, 1, _))));
        r.render_valid(item(1, 8), vec![]);
        assert!(matches!(r.bar, Some((Phase::Valid, 1, _))));
        r.render_train(item(2, 8), vec![]);
        assert!(matches!(r.bar, Some((Phase::Train, 2, _))));
        r.end(None);
        assert!(r.bar.is_none());
    }
}
