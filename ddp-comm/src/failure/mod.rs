//! What is known about a failed collective, for the errors that carry it: which collective it
//! was ([`CollectiveLabel`]), how far each rank got ([`RankProgress`], [`PeerProgress`]), and the
//! watchdog's verdict ([`WatchdogFailure`]). Plain data, below `error/`, which wraps the verdict
//! in [`CommError::Watchdog`](crate::CommError::Watchdog), and below `watchdog/`, which makes it;
//! users reach these types as `ddp_comm::watchdog::*`.

mod label;
mod progress;
mod report_file;
mod verdict;

pub use label::CollectiveLabel;
pub use progress::{PeerProgress, RankProgress};
pub(crate) use progress::{Progress, failed_key, key, scope, starts_key, with_own};
pub use report_file::{FAILURE_FILE_ENV, FailureReport};
pub use verdict::{StuckWork, WatchdogCause, WatchdogFailure};
