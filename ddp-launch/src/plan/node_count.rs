//! [`NodeCount`] and [`RdzvBackend`]: `--nnodes N` or `MIN:MAX`, and which rendezvous the
//! launchers use to form the job.

use std::fmt;
use std::str::FromStr;

/// How many nodes the job has (`--nnodes`): `N` is a fixed count (`N:N`); `MIN:MAX` is an
/// elastic job that runs with any count in that range and re-forms as nodes come and go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCount {
    /// The job starts once this many nodes joined, and stops when fewer are left.
    pub min: usize,
    /// At most this many nodes take part; more wait for a free place.
    pub max: usize,
}

impl NodeCount {
    /// Exactly `n` nodes.
    pub fn fixed(n: usize) -> Self {
        NodeCount { min: n, max: n }
    }

    /// Between `min` and `max` nodes (validated when the plan is built).
    pub fn range(min: usize, max: usize) -> Self {
        NodeCount { min, max }
    }

    /// Whether the node count may change while the job runs (`MIN < MAX`).
    pub fn is_elastic(&self) -> bool {
        self.min != self.max
    }
}

impl FromStr for NodeCount {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let number = |part: &str| {
            part.trim().parse::<usize>().map_err(|_| {
                format!("expected a number of nodes N or a range MIN:MAX (e.g. 2:4), got '{s}'")
            })
        };
        match s.split_once(':') {
            None => number(s).map(NodeCount::fixed),
            Some((min, max)) => Ok(NodeCount::range(number(min)?, number(max)?)),
        }
    }
}

impl fmt::Display for NodeCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_elastic() {
            write!(f, "{}:{}", self.min, self.max)
        } else {
            write!(f, "{}", self.min)
        }
    }
}

/// How the nodes' launchers find each other (`--rdzv-backend`; torchrun's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RdzvBackend {
    /// Fixed membership: every node is started with its `--node-rank`, node 0's launcher hosts
    /// the rendezvous on `--master-addr:--master-port`. The job never changes size.
    Static,
    /// Rounds over a store hosted by the first launcher that binds `--rdzv-endpoint` (it must
    /// be an address of that launcher's host; the port is bound on every interface). Nodes get their ranks in join order; a node that
    /// fails or arrives makes the others re-form the job. The hosting launcher is a single
    /// point of failure: if its node dies the job cannot re-form.
    C10d,
    /// Rounds as with `c10d`, in an etcd v3 cluster at `--rdzv-endpoint` (etcd's client
    /// address): no node of the job is a single point of failure, any may die and the others
    /// re-form. Needs ddp-launch built with its `etcd` feature.
    Etcd,
}

impl fmt::Display for RdzvBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RdzvBackend::Static => "static",
            RdzvBackend::C10d => "c10d",
            RdzvBackend::Etcd => "etcd",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ranges_parse_and_print_back() {
        assert_eq!("3".parse::<NodeCount>(), Ok(NodeCount::fixed(3)));
        assert_eq!(" 2:4".parse::<NodeCount>(), Ok(NodeCount::range(2, 4)));
        assert_eq!(
            "2:2".parse::<NodeCount>().map(|n| n.is_elastic()),
            Ok(false)
        );
        assert_eq!(NodeCount::range(2, 4).to_string(), "2:4");
        assert_eq!(NodeCount::fixed(2).to_string(), "2");
        // Reversed or zero counts parse; the plan rejects them with the flag's value.
        assert_eq!("4:2".parse::<NodeCount>(), Ok(NodeCount::range(4, 2)));
    }

    #[test]
    fn malformed_counts_name_the_value_and_the_expected_form() {
        for bad in ["two", "2:", ":3", "1:2:3", "-1"] {
            let e = bad.parse::<NodeCount>().unwrap_err();
            assert!(
                e.contains(&format!("got '{bad}'")) && e.contains("MIN:MAX"),
                "{e}"
            );
        }
    }
}
