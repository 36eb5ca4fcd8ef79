//! `--outcome-file`: how the command ended, as one JSON object a program reads instead of the
//! console (the Python `rdzv.launch` builds torch's `ChildFailedError` from it; a scheduler
//! learns which ranks ran here). Written once, when the agent is done, by writing a temporary
//! file beside it and renaming it, so a reader sees the whole object or none.
//!
//! ```json
//! {"exit_code": 1, "restarts": 2, "ranks": [{"local_rank": 0, "global_rank": 4}],
//!  "failures": [{"global_rank": 4, "local_rank": 0, "pid": 812, "exitcode": -11,
//!                "signal": "SIGSEGV", "timestamp": 1764640000, "error_file": "/.../error.json",
//!                "message": "...", "stopped": false}]}
//! ```
//! `ranks` are the workers of this node's last group; `failures` the failures the report
//! named (the root cause first), empty when the job did not fail here; `exitcode` is torch's
//! (a signal's negative number).

use crate::exit::{signal_name, Exit};
use crate::workers::process::Ended;
use crate::workers::report::Failure;
use serde_json::{json, Value};
use std::path::Path;
use std::time::UNIX_EPOCH;

/// What the outcome file will say, filled in as the job goes.
#[derive(Default)]
pub struct OutcomeFile {
    /// (local rank, global rank) of the last group's workers.
    pub ranks: Vec<(u32, u32)>,
    /// The reported failures, as the file gives them.
    pub failures: Vec<Value>,
}

impl OutcomeFile {
    /// Keeps the failures a report named.
    pub fn failed(&mut self, failures: &[Failure]) {
        self.failures = failures.iter().map(failure).collect();
    }

    /// Writes the file (temporary name, then rename); an error says which file.
    pub fn write(&self, path: &Path, exit: Exit, restarts: u32) -> Result<(), String> {
        let ranks: Vec<Value> = self
            .ranks
            .iter()
            .map(|&(local, global)| json!({"local_rank": local, "global_rank": global}))
            .collect();
        let object = json!({
            "exit_code": exit.code(),
            "restarts": restarts,
            "ranks": ranks,
            "failures": self.failures,
        });
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, format!("{object}\n"))
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("--outcome-file {}: {e}", path.display()))
    }
}

fn failure(f: &Failure) -> Value {
    let signal = match f.ended {
        Ended::Code(_) => Value::Null,
        Ended::Signal(sig) => Value::String(signal_name(sig)),
    };
    let (error_file, message) = match &f.error_file {
        Some((path, message)) => (
            Value::String(path.display().to_string()),
            Value::String(message.clone()),
        ),
        None => (Value::Null, Value::Null),
    };
    json!({
        "global_rank": f.global_rank,
        "local_rank": f.local_rank,
        "pid": f.pid,
        "exitcode": f.ended.exitcode(),
        "signal": signal,
        "timestamp": f.at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "error_file": error_file,
        "message": message,
        "stopped": f.stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn a_signal_is_torchs_negative_exit_code_with_its_name_and_the_file_is_whole() {
        let dir = std::env::temp_dir().join(format!("rdzv-outcome-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("outcome.json");
        let mut o = OutcomeFile {
            ranks: vec![(0, 4), (1, 5)],
            ..OutcomeFile::default()
        };
        o.failed(&[Failure {
            global_rank: 5,
            local_rank: 1,
            pid: 812,
            ended: Ended::Signal(libc::SIGSEGV),
            at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(7),
            error_file: None,
            traceback: None,
            stopped: false,
        }]);
        o.write(&path, Exit::Failure, 2).unwrap();
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["exit_code"], 1);
        assert_eq!(v["restarts"], 2);
        assert_eq!(v["ranks"][1]["global_rank"], 5);
        assert_eq!(v["failures"][0]["exitcode"], -libc::SIGSEGV);
        assert_eq!(v["failures"][0]["signal"], "SIGSEGV");
        assert_eq!(v["failures"][0]["timestamp"], 7);
        assert!(!dir.join("outcome.json.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
