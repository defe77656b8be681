//! Strict reads of the environment variables the framework understands. `std::env::var(..)
//! .ok()` reads a value that is not valid UTF-8 as "not set", so a typo'd or corrupted
//! `DDP_TIMEOUT_SECS` silently ran with the default; every reader goes through [`env_var`]
//! instead, which names the variable.

use crate::error::{CommError, Result};
use std::env::VarError;

/// The value of the environment variable `name`: `Ok(None)` when it is not set.
///
/// # Errors
/// [`CommError::InvalidConfig`] naming `name` when its value is not valid UTF-8.
pub fn env_var(name: &str) -> Result<Option<String>> {
    from_lookup(name, std::env::var(name))
}

/// [`env_var`]'s decision over one lookup's result (testable without touching the
/// environment).
fn from_lookup(
    name: &str,
    looked_up: std::result::Result<String, VarError>,
) -> Result<Option<String>> {
    match looked_up {
        Ok(v) => Ok(Some(v)),
        Err(VarError::NotPresent) => Ok(None),
        Err(VarError::NotUnicode(raw)) => Err(CommError::config(
            name,
            format!(
                "value {raw:?} is not valid UTF-8; set it to plain text (e.g. `export {name}=...`) or unset it"
            ),
        )),
    }
}

/// Why `text` did not parse as a count of at most `max`: out of range (all digits, too many)
/// or not a non-negative integer at all.
pub(crate) fn not_a_count(
    text: &str,
    max: impl std::fmt::Display,
    e: &std::num::ParseIntError,
) -> String {
    match e.kind() {
        std::num::IntErrorKind::PosOverflow => format!("'{text}' is out of range (at most {max})"),
        _ => format!("'{text}' is not a non-negative integer"),
    }
}

/// `name`'s value as a `u64`, `None` when unset or empty.
///
/// # Errors
/// [`CommError::InvalidConfig`] naming `name` when its value is not UTF-8 or not such a number.
pub(crate) fn env_u64(name: &str) -> Result<Option<u64>> {
    let Some(v) = env_var(name)? else {
        return Ok(None);
    };
    if v.trim().is_empty() {
        return Ok(None);
    }
    v.trim()
        .parse::<u64>()
        .map(Some)
        .map_err(|e| CommError::config(name, not_a_count(&v, u64::MAX, &e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn non_utf8_is_an_error_naming_the_variable_and_unset_is_none() {
        let raw = OsString::from_vec(vec![0xff]);
        let e = from_lookup("DDP_TIMEOUT_SECS", Err(VarError::NotUnicode(raw)))
            .expect_err("not UTF-8")
            .to_string();
        assert!(e.starts_with("DDP_TIMEOUT_SECS: "), "{e}");
        assert!(e.contains("not valid UTF-8"), "{e}");
        assert_eq!(
            from_lookup("X", Err(VarError::NotPresent)).expect("ok"),
            None
        );
        assert_eq!(
            from_lookup("X", Ok("7".into())).expect("ok").as_deref(),
            Some("7")
        );
    }

    #[test]
    fn too_large_is_out_of_range_not_a_non_integer() {
        let e = "99999999999999999999".parse::<u64>().expect_err("overflow");
        assert_eq!(
            not_a_count("99999999999999999999", u64::MAX, &e),
            "'99999999999999999999' is out of range (at most 18446744073709551615)"
        );
        let e = "x".parse::<u64>().expect_err("not a number");
        assert_eq!(not_a_count("x", 1, &e), "'x' is not a non-negative integer");
    }
}
