//! The agent loop of an elastic job: join a round, run this node's workers in it, learn how it
//! ended, and go again until the job completes, fails for good, or this node is interrupted.

use super::backend::RendezvousBackend;
use super::round::{Joined, Round, RoundEnd, Rounds};
use super::store_backend::StoreBackend;
use crate::error::LaunchError;
use crate::launcher_id::host_pid;
use crate::node_sync::NodeSync;
use crate::note::{note, noteln};
use crate::plan::elastic_settings::ElasticSettings;
use crate::plan::node_count::RdzvBackend;
use crate::plan::{LaunchPlan, MasterPort, RoundInfo};
use crate::rendezvous::{bind_host, free_port};
use crate::rendezvous_protocol::with_protocol;
use crate::round_summary::rounds_lines;
use crate::signals::SignalGuard;
use crate::summary::{FailureCause, FailureSummary};
use crate::supervise::live::Console;
use crate::supervise::{Outcome, attempt_log_dir, run_attempt};
use std::sync::Arc;

/// One round seen from the supervisor: failures go to the round, the round's end comes back.
struct RoundSync<'a> {
    rounds: &'a mut Rounds,
    round: &'a Round,
}

impl NodeSync for RoundSync<'_> {
    fn poll_failure(&mut self, _attempt: u32) -> Option<FailureCause> {
        self.rounds.poll(self.round)
    }

    fn report_failure(&mut self, _attempt: u32, description: &str, _abort: bool) {
        self.rounds.report_failure(self.round, description);
    }
}

/// [`LaunchPlan::run`] for an elastic plan.
pub(crate) fn run_elastic(
    plan: &LaunchPlan,
    settings: &ElasticSettings,
    signals: &SignalGuard,
    console: &Arc<Console>,
) -> Result<(), LaunchError> {
    let settings = settings.clone();
    // `host:pid`: unique while it runs.
    let node_id = host_pid();
    // What every node must agree on (the node count range, the workers per node, restarts,
    // and the round protocol).
    let config = with_protocol(&format!(
        "--nnodes {} --nproc-per-node {} --max-restarts {}",
        settings.nodes, plan.nproc_per_node, plan.max_restarts
    ));
    let backend: Box<dyn RendezvousBackend> = match settings.backend {
        RdzvBackend::C10d => Box::new(StoreBackend::connect(
            &settings,
            &config,
            &plan.job_token,
            plan.join_timeout,
            &node_id,
            signals,
        )?),
        #[cfg(feature = "etcd")]
        RdzvBackend::Etcd => Box::new(super::etcd_backend::EtcdBackend::connect(
            &settings,
            plan.join_timeout,
            &node_id,
            signals,
        )?),
        // Validation refuses it without the feature.
        #[cfg(not(feature = "etcd"))]
        RdzvBackend::Etcd => {
            return Err(LaunchError::RdzvBackendNotBuilt {
                backend: settings.backend.to_string(),
            });
        }
        // Validation gives static jobs no elastic settings.
        RdzvBackend::Static => {
            return Err(LaunchError::ElasticNeedsRounds {
                nnodes: settings.nodes.to_string(),
            });
        }
    };
    tracing::info!(%node_id, endpoint = %settings.endpoint, "joining the elastic rendezvous");
    let mut rounds = Rounds::new(
        backend,
        settings,
        node_id,
        &config,
        &plan.launch_id,
        plan.max_restarts,
        plan.join_timeout,
    )?;
    // Every node's workers get the launch id of the first node to join.
    let plan = LaunchPlan {
        launch_id: rounds.launch_id().to_string(),
        ..plan.clone()
    };
    let mut result = agent_loop(&plan, &mut rounds, signals, console);
    let history = rounds.history();
    note!(
        "ddp launcher: elastic job rounds (node {}):\n{}",
        rounds.node_id(),
        rounds_lines(&history)
    );
    if let Err(LaunchError::WorkerFailed(summary)) = &mut result {
        summary.rounds = history;
        note!("{}", summary.report());
    }
    rounds.close(signals);
    result
}

/// A summary for a job that failed for good with `cause`.
fn gave_up(plan: &LaunchPlan, restarts: u32, cause: FailureCause) -> LaunchError {
    LaunchError::WorkerFailed(Box::new(FailureSummary {
        cause,
        restart_count: restarts,
        max_restarts: plan.max_restarts,
        others: Vec::new(),
        root_cause: None,
        rounds: Vec::new(),
    }))
}

fn agent_loop(
    plan: &LaunchPlan,
    rounds: &mut Rounds,
    signals: &SignalGuard,
    console: &Arc<Console>,
) -> Result<(), LaunchError> {
    let mut previous_port = None;
    loop {
        let round = match rounds.join(signals)? {
            Joined::Round(round) => round,
            Joined::JobOver(Ok(())) => {
                noteln!(
                    "ddp launcher: the job completed while this node waited for a place{}",
                    rounds.stale_job_hint()
                );
                return Ok(());
            }
            Joined::JobOver(Err(reason)) => {
                return Err(gave_up(
                    plan,
                    plan.max_restarts,
                    FailureCause::OtherNode {
                        description: format!("{reason}{}", rounds.stale_job_hint()),
                    },
                ));
            }
        };
        // Bound on every interface of this host, IPv6 when this node is reached over IPv6.
        let host = bind_host(&rounds.advertised_host());
        let pick_port = || free_port(host, previous_port);
        let end = match rounds.master(&round, pick_port, signals)? {
            None => rounds.wait_end(&round, signals)?,
            Some(master) => {
                previous_port = Some(master.port);
                let mut round_plan = plan.clone();
                round_plan.nnodes = round.members.len();
                round_plan.node_rank = round.node_rank;
                round_plan.master_addr = master.host.clone();
                round_plan.master_port = MasterPort::Fixed(master.port);
                round_plan.rdzv_round = Some(RoundInfo {
                    number: round.number,
                    restarts_before: round.restarts_before,
                });
                noteln!(
                    "ddp launcher: round {} with {} node(s), world size {}: this node ({}) is node {}, ranks {}..{}",
                    round.number,
                    round.members.len(),
                    round_plan.world_size(),
                    rounds.node_id(),
                    round.node_rank,
                    round_plan.global_rank(0),
                    round_plan.global_rank(plan.nproc_per_node - 1),
                );
                let log_dir = attempt_log_dir(plan, round.number)?;
                let outcome = run_attempt(
                    &round_plan,
                    round.number,
                    master.port,
                    log_dir,
                    signals,
                    console,
                    Some(&mut RoundSync {
                        rounds: &mut *rounds,
                        round: &round,
                    }),
                )?;
                match outcome {
                    Outcome::Interrupted(signal) => {
                        return Err(LaunchError::Interrupted { signal });
                    }
                    Outcome::Succeeded => rounds.finish(&round, signals)?,
                    Outcome::Failed(mut summary) => {
                        // The attempt ran as round `round.number` (its files, DDP_RESTART_COUNT),
                        // but the summary counts restarts spent: rounds re-formed because a node
                        // joined or left are free.
                        summary.restart_count = round.restarts_before;
                        if let FailureCause::LostRendezvous { .. } = summary.cause {
                            return Err(LaunchError::WorkerFailed(Box::new(summary)));
                        }
                        if let FailureCause::Rank(_) = summary.cause {
                            note!("{}", summary.report());
                        }
                        rounds.wait_end(&round, signals)?
                    }
                }
            }
        };
        rounds.record_end(&round, &end);
        match &end {
            RoundEnd::Completed => return Ok(()),
            RoundEnd::Failure(why) if rounds.out_of_restarts(&round, &end) => {
                return Err(gave_up(
                    plan,
                    round.restarts_before,
                    FailureCause::OtherNode {
                        description: format!(
                            "round {} ended in a failure with no restarts left (--max-restarts {}): {why}",
                            round.number, plan.max_restarts
                        ),
                    },
                ));
            }
            RoundEnd::Failure(why) => noteln!(
                "ddp launcher: round {} ended in a failure ({why}); re-forming the job (restart {} of {})",
                round.number,
                round.restarts_before + 1,
                plan.max_restarts
            ),
            RoundEnd::NodeJoined(why) => noteln!(
                "ddp launcher: round {} ended: {why}; re-forming the job",
                round.number
            ),
            RoundEnd::MemberLeft(why) => noteln!(
                "ddp launcher: round {} ended before it started ({why}); re-forming the job without it (no restart spent)",
                round.number
            ),
        }
    }
}
