//! The program every worker runs ([`WorkerCommand`]), and finding it as `execvp` would, so
//! that a typo fails before anything starts.

use crate::error::LaunchError;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// The program every worker runs, and how to show it.
#[derive(Debug, Clone)]
pub(crate) struct WorkerCommand {
    /// Path to execute.
    pub(crate) program: PathBuf,
    /// `argv[0]` the workers see.
    pub(crate) arg0: OsString,
    /// The remaining arguments.
    pub(crate) args: Vec<OsString>,
}

/// Finds the program as `execvp` would, with a clear error when it cannot run.
pub(crate) fn resolve_program(
    program: &OsStr,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, LaunchError> {
    let name = program.to_string_lossy().into_owned();
    if program.is_empty() {
        return Err(LaunchError::ProgramNotFound {
            program: name,
            reason: "the program name is empty".into(),
        });
    }
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(LaunchError::ProgramNotFound {
                    program: name,
                    reason: "no such file".into(),
                })
            }
            Err(e) => Err(LaunchError::ProgramNotExecutable {
                program: name,
                reason: e.to_string(),
            }),
            Ok(m) if m.is_dir() => Err(LaunchError::ProgramNotExecutable {
                program: name,
                reason: "it is a directory".into(),
            }),
            Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                Err(LaunchError::ProgramNotExecutable {
                    program: name,
                    reason: "it has no execute permission".into(),
                })
            }
            Ok(_) => Ok(path),
        };
    }
    let Some(path_var) = path_var.filter(|p| !p.is_empty()) else {
        return Err(LaunchError::ProgramNotFound {
            program: name,
            reason: "PATH is not set; give a path such as ./program".into(),
        });
    };
    for dir in std::env::split_paths(path_var) {
        let candidate = dir.join(program);
        if let Ok(m) = std::fs::metadata(&candidate)
            && m.is_file()
            && m.permissions().mode() & 0o111 != 0
        {
            return Ok(candidate);
        }
    }
    Err(LaunchError::ProgramNotFound {
        program: name.clone(),
        reason: format!(
            "no executable '{name}' in PATH (give a path such as ./{name} for a file here)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_resolved_like_execvp_with_clear_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = dir.path().join("train");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let data = dir.path().join("data.txt");
        std::fs::write(&data, "x").expect("write");
        let path = Some(dir.path().as_os_str());

        assert_eq!(
            resolve_program(OsStr::new("train"), path).expect("on PATH"),
            exe
        );
        assert_eq!(
            resolve_program(exe.as_os_str(), None).expect("by path"),
            exe
        );
        let e = resolve_program(OsStr::new("./no-such-program"), path)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "program './no-such-program' was not found: no such file");
        let e = resolve_program(OsStr::new("no-such-program"), path)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("program 'no-such-program' was not found: no executable"),
            "{e}"
        );
        let e = resolve_program(data.as_os_str(), path)
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("cannot be executed: it has no execute permission"),
            "{e}"
        );
        let e = resolve_program(dir.path().as_os_str(), path)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("cannot be executed: it is a directory"), "{e}");
        let e = resolve_program(OsStr::new("data.txt"), path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("was not found"), "{e}");
    }
}
