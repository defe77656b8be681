//! The environment of a Slurm job step (`srun`): `SLURM_*` variables, the master from the
//! step's node list, the port from the job and step ids.

use super::{LauncherKind, Vars, WorkerEnv, derived_port};
use crate::error::LaunchError;

pub(super) fn from_slurm(v: &Vars<'_>) -> Result<WorkerEnv, LaunchError> {
    const NAME: &str = "srun";
    let rank: usize = v.required("SLURM_PROCID", NAME)?;
    let (world_var, world) = v
        .first(&["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"])
        .ok_or_else(|| {
            LaunchError::worker_env(
                "SLURM_NTASKS",
                "is not set, but srun sets it for every task",
            )
        })?;
    let world_size: usize = world.parse().map_err(|_| {
        LaunchError::worker_env(
            &world_var,
            format!("'{world}' is not a non-negative integer"),
        )
    })?;
    let local_rank: usize = v.required("SLURM_LOCALID", NAME)?;
    let node_rank: usize = v.number("SLURM_NODEID")?.unwrap_or(0);
    let local_world_size = slurm_local_world_size(v, node_rank)?;
    let master_addr = match v.get("MASTER_ADDR") {
        Some(a) => a,
        // Every task on this node: loopback keeps the job off the network.
        None if local_world_size >= world_size => "127.0.0.1".into(),
        None => match v.first(&[
            "SLURM_STEP_NODELIST",
            "SLURM_JOB_NODELIST",
            "SLURM_NODELIST",
        ]) {
            Some((var, list)) => first_host(&list).ok_or_else(|| {
                LaunchError::worker_env(&var, format!("cannot read a host name from '{list}'"))
            })?,
            None => v.get("SLURM_LAUNCH_NODE_IPADDR").ok_or_else(|| {
                LaunchError::worker_env(
                    "MASTER_ADDR",
                    "is not set, and neither is SLURM_JOB_NODELIST: set it to the host of rank 0",
                )
            })?,
        },
    };
    let master_port = match v.port()? {
        Some(p) => p,
        None => {
            let job: u64 = v.required("SLURM_JOB_ID", NAME)?;
            let step: u64 = v
                .first(&["SLURM_STEP_ID", "SLURM_STEPID"])
                .and_then(|(_, s)| s.parse().ok())
                .unwrap_or(0);
            slurm_port(job, step)
        }
    };
    let (job_token, timeout, restart_count) = v.common()?;
    Ok(WorkerEnv {
        launcher: LauncherKind::Slurm,
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        master_addr,
        master_port,
        restart_count,
        job_token,
        timeout,
    })
}

/// The port every task of a Slurm step agrees on without talking: derived from the job and step
/// ids, in [`DERIVED_PORTS`](super::worker_env::DERIVED_PORTS).
pub(crate) fn slurm_port(job_id: u64, step_id: u64) -> u16 {
    derived_port(job_id.wrapping_mul(7919).wrapping_add(step_id))
}

/// Tasks on node `node_rank`: from `SLURM_STEP_TASKS_PER_NODE` / `SLURM_TASKS_PER_NODE`
/// (`2(x3),1`) or `SLURM_NTASKS_PER_NODE`.
fn slurm_local_world_size(v: &Vars<'_>, node_rank: usize) -> Result<usize, LaunchError> {
    if let Some((var, spec)) = v.first(&["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]) {
        let counts = parse_tasks_per_node(&spec).ok_or_else(|| {
            LaunchError::worker_env(
                &var,
                format!("cannot parse '{spec}' (expected e.g. 2(x3),1)"),
            )
        })?;
        return counts.get(node_rank).copied().ok_or_else(|| {
            LaunchError::worker_env(
                &var,
                format!(
                    "'{spec}' lists {} nodes, but SLURM_NODEID is {node_rank}",
                    counts.len()
                ),
            )
        });
    }
    v.number("SLURM_NTASKS_PER_NODE")?.ok_or_else(|| {
        LaunchError::worker_env(
            "SLURM_TASKS_PER_NODE",
            "is not set, nor SLURM_STEP_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE",
        )
    })
}

/// Expands Slurm's `2(x3),1` into `[2, 2, 2, 1]`.
pub(crate) fn parse_tasks_per_node(spec: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        let (count, repeat) = match part.split_once('(') {
            Some((count, rest)) => {
                let times = rest.strip_prefix('x')?.strip_suffix(')')?;
                (count, times.parse::<usize>().ok()?)
            }
            None => (part, 1),
        };
        let count: usize = count.parse().ok()?;
        out.extend(std::iter::repeat_n(count, repeat));
    }
    (!out.is_empty()).then_some(out)
}

/// The first host of a Slurm host list: `node[01-04,07],gpu5` gives `node01`.
pub(crate) fn first_host(list: &str) -> Option<String> {
    // The first entry ends at the first comma outside brackets.
    let mut depth = 0usize;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let entry = list[..end].trim();
    // Replace every bracket group by its first value (`01-04,07` -> `01`).
    let mut host = String::new();
    let mut rest = entry;
    while let Some(open) = rest.find('[') {
        host.push_str(&rest[..open]);
        let close = rest[open..].find(']')? + open;
        let first = rest[open + 1..close].split([',', '-']).next()?.trim();
        if first.is_empty() {
            return None;
        }
        host.push_str(first);
        rest = &rest[close + 1..];
    }
    host.push_str(rest);
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::super::DERIVED_PORTS;
    use super::super::tests::{placement, refusal, worker};
    use super::*;
    use ddp_comm::TOKEN_ENV;

    #[test]
    fn slurm_step_environment_is_translated() {
        let env = worker(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_NUM_TASKS", "6"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x3)"),
            ("SLURM_JOB_ID", "12345"),
            ("SLURM_STEP_NODELIST", "gpu[07-09]"),
            ("SLURM_LAUNCH_NODE_IPADDR", "10.9.9.9"),
            (TOKEN_ENV, "secret"),
        ]);
        assert_eq!(env.launcher, LauncherKind::Slurm);
        assert_eq!(placement(&env), (5, 6, 1, 2, 2));
        assert_eq!(env.master_addr, "gpu07");
        assert_eq!(env.master_port, slurm_port(12345, 0));
        assert!(DERIVED_PORTS.contains(&env.master_port));
    }

    #[test]
    fn slurm_prefers_explicit_master_and_falls_back_to_launch_node() {
        let base = [
            ("SLURM_PROCID", "0"),
            ("SLURM_STEPID", "3"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "1"),
            ("SLURM_JOB_ID", "7"),
            (TOKEN_ENV, "secret"),
        ];
        let mut with_master = base.to_vec();
        with_master.extend([("MASTER_ADDR", "head"), ("MASTER_PORT", "4000")]);
        let env = worker(&with_master);
        assert_eq!((env.master_addr.as_str(), env.master_port), ("head", 4000));
        assert_eq!(env.local_world_size, 1);
        let mut launch_node = base.to_vec();
        launch_node.push(("SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"));
        let env = worker(&launch_node);
        assert_eq!(env.master_addr, "10.1.2.3");
        assert_eq!(env.master_port, slurm_port(7, 3));
        let e = refusal(&base);
        assert!(
            e.starts_with("MASTER_ADDR: is not set, and neither is SLURM_JOB_NODELIST"),
            "{e}"
        );
    }

    #[test]
    fn slurm_node_outside_tasks_per_node_is_an_error() {
        let e = refusal(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "3"),
            ("SLURM_TASKS_PER_NODE", "1(x2)"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]);
        assert_eq!(
            e,
            "SLURM_TASKS_PER_NODE: '1(x2)' lists 2 nodes, but SLURM_NODEID is 3"
        );
    }

    #[test]
    fn a_one_node_slurm_step_meets_on_loopback_and_needs_no_secret() {
        let env = worker(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NODELIST", "n1"),
        ]);
        assert_eq!(
            (env.master_addr.as_str(), env.job_token),
            ("127.0.0.1", None)
        );
    }

    #[test]
    fn tasks_per_node_and_host_lists_expand() {
        assert_eq!(parse_tasks_per_node("2(x3),1"), Some(vec![2, 2, 2, 1]));
        assert_eq!(parse_tasks_per_node("4"), Some(vec![4]));
        assert_eq!(parse_tasks_per_node("2(3)"), None);
        assert_eq!(parse_tasks_per_node("x"), None);
        assert_eq!(first_host("node[01-04,07],gpu5").as_deref(), Some("node01"));
        assert_eq!(first_host("gpu5,node[1-2]").as_deref(), Some("gpu5"));
        assert_eq!(
            first_host("rack[3,5]-n[10-12]").as_deref(),
            Some("rack3-n10")
        );
        assert_eq!(first_host("solo").as_deref(), Some("solo"));
        assert_eq!(first_host("bad[").as_deref(), None);
        assert_eq!(first_host("").as_deref(), None);
    }
}
