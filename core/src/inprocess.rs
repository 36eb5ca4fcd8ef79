//! In-process restart (`rdzv run --in-process-restart`): the control file a launcher and one of
//! its workers share (`RDZV_INPROCESS_FILE`), both sides of it. The launcher writes it whole (a
//! temporary name, then a rename):
//!
//! ```text
//! {"generation": G, "state": "run", "env": {"RANK": "3", "WORLD_SIZE": "4", ...}}
//! {"generation": G, "state": "leave"}
//! ```
//!
//! `run` hands the worker a round's environment (torchrun's variables, as a new process would
//! get them); `leave` asks it to leave its training function, tear down its process group and
//! wait for the next `run`. The worker answers a `leave` by writing `G` to the file's `.left`
//! twin (renamed into place too). Generations only grow. Python's `rdzv.inprocess` reads the
//! same file in Python (it must update `os.environ`, which a C `setenv` does not reach); this
//! is the launcher's side and the C ABI's worker side (`rdzv_inprocess_check`,
//! `rdzv_inprocess_next`).

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The variable that names a worker's control file; set by `rdzv run --in-process-restart`.
pub const CONTROL_FILE_ENV: &str = "RDZV_INPROCESS_FILE";

/// Where the worker of `control` answers a `leave`.
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

/// The launcher's side: hands the worker of `control` a round's environment.
pub fn write_run(control: &Path, generation: u64, env: &[(String, String)]) -> std::io::Result<()> {
    let env: serde_json::Map<String, serde_json::Value> = env
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let text = serde_json::json!({"generation": generation, "state": "run", "env": env});
    write_whole(control, &text.to_string())
}

/// The launcher's side: asks the worker of `control` to leave its function.
pub fn write_leave(control: &Path, generation: u64) -> std::io::Result<()> {
    let text = serde_json::json!({"generation": generation, "state": "leave"});
    write_whole(control, &text.to_string())
}

/// The launcher's side: whether the worker of `control` has left for `generation`.
pub fn has_left(control: &Path, generation: u64) -> bool {
    std::fs::read_to_string(answer_file(control))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .is_some_and(|g| g >= generation)
}

/// The launcher's side: forgets what an earlier worker of this directory answered.
pub fn clear(control: &Path) {
    let _ = std::fs::remove_file(answer_file(control));
}

/// What the control file said when last read.
#[derive(Default)]
struct Seen {
    /// The file's inode and modification time: every write is a new file (renamed into
    /// place), so the inode changes even when two writes fall in one tick of the clock.
    version: Option<(u64, std::time::SystemTime)>,
    generation: i64,
    leave: bool,
    env: Vec<(String, String)>,
}

/// The worker's side of one control file.
pub struct Worker {
    path: PathBuf,
    seen: Mutex<Seen>,
    /// The generation of the round the worker runs in (-1 before the first).
    running: Mutex<i64>,
}

impl Worker {
    /// The control file named by `RDZV_INPROCESS_FILE`, or None outside `rdzv run
    /// --in-process-restart`.
    pub fn from_env() -> Option<Worker> {
        let path = std::env::var_os(CONTROL_FILE_ENV).filter(|p| !p.is_empty())?;
        Some(Worker::at(PathBuf::from(path)))
    }

    pub fn at(path: PathBuf) -> Worker {
        Worker {
            path,
            seen: Mutex::new(Seen {
                generation: -1,
                ..Seen::default()
            }),
            running: Mutex::new(-1),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn running(&self) -> std::sync::MutexGuard<'_, i64> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the file again if it changed (one `stat` when it did not).
    fn refresh(&self) {
        use std::os::unix::fs::MetadataExt;
        let Ok(version) = std::fs::metadata(&self.path).and_then(|m| Ok((m.ino(), m.modified()?)))
        else {
            return;
        };
        let mut seen = self.seen();
        if seen.version == Some(version) {
            return;
        }
        // Renamed into place, so never half written; unreadable: looked at again next time.
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return;
        };
        let Ok(control) = serde_json::from_str::<serde_json::Value>(&text) else {
            return;
        };
        seen.version = Some(version);
        seen.generation = control["generation"].as_i64().unwrap_or(-1);
        seen.leave = control["state"] == "leave";
        if control["state"] == "run" {
            seen.env = control["env"]
                .as_object()
                .map(|env| {
                    env.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default();
        }
    }

    /// Whether the launcher asks this worker to leave the round it runs in.
    pub fn leave_asked(&self) -> bool {
        self.refresh();
        let seen = self.seen();
        seen.leave && seen.generation > *self.running()
    }

    /// Answers a pending `leave` (if any), then waits up to `timeout` for the next round and
    /// returns its environment; the first call returns the first round at once. A leave asked
    /// while it waits (the round handed out ended before this worker started in it) is
    /// answered too: the worker is not in a round, so it has left already.
    pub fn next(&self, timeout: Duration) -> Result<Vec<(String, String)>> {
        let deadline = Instant::now() + timeout;
        let mut answered = -1;
        loop {
            self.refresh();
            {
                let seen = self.seen();
                if seen.leave && seen.generation > *self.running() && seen.generation != answered {
                    write_whole(&answer_file(&self.path), &seen.generation.to_string()).map_err(
                        |e| {
                            Error::internal(format!(
                                "in-process restart: cannot answer in {}: {e}",
                                answer_file(&self.path).display()
                            ))
                        },
                    )?;
                    answered = seen.generation;
                }
            }
            {
                let seen = self.seen();
                let mut running = self.running();
                if !seen.leave && seen.generation > *running {
                    *running = seen.generation;
                    return Ok(seen.env.clone());
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "in-process restart: no round within {} ms",
                    timeout.as_millis()
                )));
            }
            // The launcher writes a round once it has formed: looked at every 10 ms.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_runs_a_round_is_asked_to_leave_answers_and_gets_the_next() {
        let dir = std::env::temp_dir().join(format!("rdzv-inprocess-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let control = dir.join("inprocess.json");
        let env = |rank: &str| vec![("RANK".to_string(), rank.to_string())];
        write_run(&control, 0, &env("0")).unwrap();
        let worker = Worker::at(control.clone());
        assert_eq!(worker.next(Duration::from_secs(1)).unwrap(), env("0"));
        assert!(!worker.leave_asked());
        write_leave(&control, 1).unwrap();
        assert!(worker.leave_asked());
        assert!(!has_left(&control, 1));
        // No round yet: the wait ends at its timeout, after answering the leave.
        let err = worker.next(Duration::from_millis(50)).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Timeout);
        assert!(has_left(&control, 1));
        write_run(&control, 2, &env("3")).unwrap();
        assert_eq!(worker.next(Duration::from_secs(1)).unwrap(), env("3"));
        assert!(!worker.leave_asked());
        clear(&control);
        assert!(!has_left(&control, 1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_leave_asked_while_a_worker_waits_for_its_round_is_answered() {
        let dir = std::env::temp_dir().join(format!("rdzv-inprocess-wait-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let control = dir.join("inprocess.json");
        // A spare waits for its first round; the round handed to it ends (a leave) before it
        // looked, while it waits: a leave the entry's answer does not see.
        let worker = Worker::at(control.clone());
        let asker = {
            let control = control.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                write_leave(&control, 4).unwrap();
            })
        };
        let err = worker.next(Duration::from_millis(500)).unwrap_err();
        asker.join().unwrap();
        assert_eq!(err.kind(), crate::ErrorKind::Timeout);
        assert!(
            has_left(&control, 4),
            "the leave was answered while it waited"
        );
        let env = vec![("RANK".to_string(), "2".to_string())];
        write_run(&control, 5, &env).unwrap();
        assert_eq!(worker.next(Duration::from_secs(1)).unwrap(), env);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
