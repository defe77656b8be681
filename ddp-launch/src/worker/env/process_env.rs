//! Strict reads of the process environment for the launcher and its workers (one place, a
//! leaf of the crate's modules: both the plan and the worker environment read through it).

use crate::error::LaunchError;

/// Runs `read` over the process environment, strictly: if any variable it looked up holds a
/// value that is not valid UTF-8, the result is an error naming that variable, whatever `read`
/// made of it being absent (`std::env::var(..).ok()` would silently run with a default).
pub(crate) fn with_process_env<T>(
    read: impl FnOnce(&dyn Fn(&str) -> Option<String>) -> Result<T, LaunchError>,
) -> Result<T, LaunchError> {
    let not_utf8 = std::cell::RefCell::new(None::<LaunchError>);
    let lookup = |k: &str| match ddp_comm::env_var(k) {
        Ok(v) => v,
        Err(e) => {
            let reason = match e {
                ddp_comm::CommError::InvalidConfig { reason, .. } => reason,
                other => other.to_string(),
            };
            not_utf8
                .borrow_mut()
                .get_or_insert_with(|| LaunchError::worker_env(k, reason));
            None
        }
    };
    let result = read(&lookup);
    match not_utf8.into_inner() {
        Some(e) => Err(e),
        None => result,
    }
}
