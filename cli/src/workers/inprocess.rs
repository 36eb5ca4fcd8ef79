//! In-process restart (`--in-process-restart`): the launcher and each worker share a control
//! file (`RDZV_INPROCESS_FILE`, beside the worker's error file). The launcher writes it whole
//! (a temporary name, then a rename), the worker's wrapper (`rdzv.inprocess` in Python) reads
//! it when it changes:
//!
//! ```text
//! {"generation": G, "state": "run", "env": {"RANK": "3", "WORLD_SIZE": "4", ...}}
//! {"generation": G, "state": "leave"}
//! ```
//!
//! `run` hands the worker the round's environment (torchrun's variables, as a new process
//! would get them); `leave` asks it to leave its training function, tear down its process
//! group and wait for the next `run`. It answers a `leave` by writing `G` to the file's
//! `.left` twin (also renamed into place); a worker that has not answered within the bound the
//! agent gives is stopped and started again, as without the flag.

use std::path::{Path, PathBuf};

/// The variable that names a worker's control file.
pub const CONTROL_FILE_ENV: &str = "RDZV_INPROCESS_FILE";

/// A worker's control file: beside its error file, so it lives in the worker's directory.
pub fn control_file(error_file: &Path) -> PathBuf {
    error_file.with_file_name("inprocess.json")
}

/// Where the worker answers a `leave`.
fn answer_file(control: &Path) -> PathBuf {
    let mut name = control.as_os_str().to_owned();
    name.push(".left");
    PathBuf::from(name)
}

fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path))
}

/// Hands the worker of `control` the round's environment, generation `generation`.
pub fn run(control: &Path, generation: u64, env: &[(String, String)]) -> std::io::Result<()> {
    let env: serde_json::Map<String, serde_json::Value> = env
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let text = serde_json::json!({"generation": generation, "state": "run", "env": env});
    write_whole(control, &text.to_string())
}

/// Asks the worker of `control` to leave its function (generation `generation`).
pub fn leave(control: &Path, generation: u64) -> std::io::Result<()> {
    let text = serde_json::json!({"generation": generation, "state": "leave"});
    write_whole(control, &text.to_string())
}

/// Whether the worker of `control` has left for generation `generation`.
pub fn has_left(control: &Path, generation: u64) -> bool {
    std::fs::read_to_string(answer_file(control))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .is_some_and(|g| g >= generation)
}

/// Removes what an earlier worker in this directory left (its answer).
pub fn clear(control: &Path) {
    let _ = std::fs::remove_file(answer_file(control));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leave_is_answered_by_the_left_file_and_a_run_carries_the_environment() {
        let dir = std::env::temp_dir().join(format!("rdzv-inprocess-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let control = control_file(&dir.join("error.json"));
        let env = [("RANK".to_string(), "3".to_string())];
        run(&control, 1, &env).unwrap();
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&control).unwrap()).unwrap();
        assert_eq!(written["state"], "run");
        assert_eq!(written["env"]["RANK"], "3");
        leave(&control, 2).unwrap();
        assert!(!has_left(&control, 2));
        std::fs::write(answer_file(&control), "1").unwrap();
        assert!(!has_left(&control, 2), "an answer to an older leave");
        std::fs::write(answer_file(&control), "2\n").unwrap();
        assert!(has_left(&control, 2));
        clear(&control);
        assert!(!has_left(&control, 2));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
