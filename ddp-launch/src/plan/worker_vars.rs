//! The variables each worker of a plan gets ([`LaunchPlan::worker_env`]): its ranks and world,
//! node 0's address, the restart counts, the job token and launch id, torchrun's names for
//! them, and the thread and allocator settings.

use crate::plan::LaunchPlan;
use crate::worker::env::launcher_vars::{
    LAUNCH_ID_ENV, RDZV_ROUND_ENV, RESTART_COUNT_ENV, WORKER_ENV,
};
use ddp_comm::TOKEN_ENV;

impl LaunchPlan {
    /// The variables set for `local_rank` on attempt `restart_count`, when the workers' store
    /// is on `master_port`. Everything else is inherited from the launcher.
    pub fn worker_env(
        &self,
        local_rank: usize,
        restart_count: u32,
        master_port: u16,
    ) -> Vec<(String, String)> {
        let torchelastic_restarts = self
            .rdzv_round
            .map_or(restart_count, |round| round.restarts_before);
        let mut env: Vec<(String, String)> = [
            (WORKER_ENV, "1".to_string()),
            ("RANK", self.global_rank(local_rank).to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("WORLD_SIZE", self.world_size().to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("GROUP_WORLD_SIZE", self.nnodes.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", master_port.to_string()),
            (RESTART_COUNT_ENV, restart_count.to_string()),
            (
                "TORCHELASTIC_RESTART_COUNT",
                torchelastic_restarts.to_string(),
            ),
            ("TORCHELASTIC_MAX_RESTARTS", self.max_restarts.to_string()),
            ("TORCHELASTIC_RUN_ID", self.run_id.clone()),
            // torchrun's single worker role, which spans every rank.
            ("ROLE_NAME", "default".to_string()),
            ("ROLE_RANK", self.global_rank(local_rank).to_string()),
            ("ROLE_WORLD_SIZE", self.world_size().to_string()),
            (TOKEN_ENV, self.job_token.clone()),
            (LAUNCH_ID_ENV, self.launch_id.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(round) = self.rdzv_round {
            env.push((RDZV_ROUND_ENV.to_string(), round.number.to_string()));
        }
        env.extend(self.thread_env.iter().cloned());
        env
    }
}

#[cfg(test)]
mod tests {
    use crate::error::LaunchError;
    use crate::plan::RoundInfo;
    use crate::plan::args::{LaunchArgs, NprocPerNode};
    use crate::plan::host::ALLOCATOR_USER_VARS;
    use crate::plan::node_count::RdzvBackend;
    use crate::plan::tests::{assert_vars, env_of, first_env, plan, valid_plan};
    use crate::worker::env::launcher_vars::{
        ALLOCATOR_ENV, RDZV_ROUND_ENV, RESTART_COUNT_ENV, WORKER_ENV,
    };
    use ddp_comm::TOKEN_ENV;
    use std::collections::HashMap;

    #[test]
    fn node_k_local_rank_j_is_global_rank_k_times_nproc_plus_j() {
        let args = LaunchArgs::new()
            .with_nproc_per_node(NprocPerNode::Count(4))
            .with_nodes(3, 2)
            .with_master_addr("10.0.0.1")
            .with_master_port(29500);
        let p = valid_plan(&args, 8, &[(TOKEN_ENV, "secret")]);
        assert_eq!(p.world_size(), 12);
        assert_eq!(
            (0..4).map(|j| p.global_rank(j)).collect::<Vec<_>>(),
            vec![8, 9, 10, 11]
        );
        assert_vars(
            &env_of(&p, 3),
            &[
                ("RANK", "11"),
                ("LOCAL_RANK", "3"),
                ("WORLD_SIZE", "12"),
                ("LOCAL_WORLD_SIZE", "4"),
                ("GROUP_RANK", "2"),
                ("GROUP_WORLD_SIZE", "3"),
                ("MASTER_ADDR", "10.0.0.1"),
                ("MASTER_PORT", "4242"),
                (TOKEN_ENV, "secret"),
            ],
        );
    }

    #[test]
    fn worker_env_marks_workers_and_carries_restart_count() {
        let p = plan(
            &LaunchArgs::new()
                .with_nproc_per_node(NprocPerNode::Count(2))
                .with_max_restarts(3),
        )
        .expect("valid");
        let env = env_of(&p, 1);
        assert_vars(
            &env,
            &[
                (WORKER_ENV, "1"),
                (RESTART_COUNT_ENV, "2"),
                ("TORCHELASTIC_RESTART_COUNT", "2"),
                ("TORCHELASTIC_MAX_RESTARTS", "3"),
                // torchrun's single role, and its run id
                // (`torch.distributed.is_torchelastic_launched()` looks for it): "none" unless
                // --rdzv-id names one.
                ("TORCHELASTIC_RUN_ID", "none"),
                ("ROLE_NAME", "default"),
                ("ROLE_RANK", "1"),
                ("ROLE_WORLD_SIZE", "2"),
            ],
        );
        // Every rank of one plan shares the token.
        assert_eq!(env_of(&p, 0)[TOKEN_ENV], env[TOKEN_ENV]);
        let named = plan(&LaunchArgs::new().with_rdzv_id("job7")).expect("valid");
        assert_eq!(env_of(&named, 0)["TORCHELASTIC_RUN_ID"], "job7");
    }

    #[test]
    fn thread_counts_default_to_cores_per_local_rank_unless_set() {
        let args = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(3));
        let env = first_env(&args, 8, &[]);
        assert_eq!(env["OMP_NUM_THREADS"], "2");
        assert_eq!(env["RAYON_NUM_THREADS"], "2");
        let env = first_env(&args, 8, &[("OMP_NUM_THREADS", "7")]);
        assert!(
            !env.contains_key("OMP_NUM_THREADS"),
            "inherited, not overridden"
        );
        assert_eq!(env["RAYON_NUM_THREADS"], "2");
        // More ranks than cores still gets one thread each.
        let many = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(16));
        assert_eq!(first_env(&many, 8, &[])["OMP_NUM_THREADS"], "1");
    }

    #[test]
    fn allocator_defaults_apply_unless_the_user_tunes_the_allocator() {
        let args = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(2));
        let env = first_env(&args, 8, &[]);
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            for (k, v) in ALLOCATOR_ENV {
                assert_eq!(env[k], v, "{k}");
            }
        }
        for user in ALLOCATOR_USER_VARS {
            let env = first_env(&args, 8, &[(user, "x")]);
            assert!(
                ALLOCATOR_ENV.iter().all(|(k, _)| !env.contains_key(*k)),
                "{user} set: the user's allocator settings are left alone"
            );
        }
    }

    #[test]
    fn elastic_plans_need_a_token_and_give_workers_their_round() {
        let args = LaunchArgs::new()
            .with_nproc_per_node(NprocPerNode::Count(2))
            .with_elastic_nodes(2, 3, "127.0.0.1:29400");
        assert!(matches!(
            plan(&args).unwrap_err(),
            LaunchError::MissingJobToken { nnodes: 3 }
        ));
        let p = valid_plan(&args, 8, &[(TOKEN_ENV, "t")]);
        assert_eq!(p.elastic_nodes(), Some((2, 3)));
        assert!(!p.is_multi_node(), "static rendezvous only");
        let mut round = p.clone();
        round.rdzv_round = Some(RoundInfo {
            number: 4,
            restarts_before: 1,
        });
        let env: HashMap<_, _> = round.worker_env(0, 4, 4242).into_iter().collect();
        assert_eq!(env[RDZV_ROUND_ENV], "4");
        assert_eq!(env[RESTART_COUNT_ENV], "4");
        // torchrun counts failure restarts only: rounds re-formed for a joining node do not.
        assert_eq!(env["TORCHELASTIC_RESTART_COUNT"], "1");
        assert_eq!(env["TORCHELASTIC_RUN_ID"], "none", "the default --rdzv-id");
        assert!(!env_of(&p, 0).contains_key(RDZV_ROUND_ENV));
        // N:N with the c10d backend is elastic too (ranks by join order, re-forming on failure).
        let fixed = LaunchArgs::new()
            .with_elastic_nodes(2, 2, "h:1")
            .with_rdzv_backend(RdzvBackend::C10d);
        let p = valid_plan(&fixed, 8, &[(TOKEN_ENV, "t")]);
        assert_eq!(p.elastic_nodes(), Some((2, 2)));
    }
}
