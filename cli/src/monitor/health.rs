//! `--health-check CMD`: a command that says whether this node is fit to train (exit 0). Run
//! before every join, and every `--health-check-interval` while training, each run bounded by
//! `--health-check-timeout`. What goes in CMD on GPU machines is in docs/LAUNCHER.md.

use crate::settings::monitor::HealthCheck;
use std::process::Stdio;
use tokio::io::AsyncReadExt;

/// How many of the command's last output lines a failure quotes.
const TAIL_LINES: usize = 5;

/// A failed check: why, in one line (exit code or timeout, and the output's last lines).
#[derive(Debug, Clone, PartialEq)]
pub struct Unhealthy(pub String);

/// Runs the command once (`sh -c CMD`, its stdout and stderr captured together).
pub async fn check(hc: &HealthCheck) -> Result<(), Unhealthy> {
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        // One pipe for both streams, in the order written: stderr goes where stdout goes.
        .arg(format!("exec 2>&1\n{}", hc.command))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            Unhealthy(format!(
                "health check {:?} could not start: {e}",
                hc.command
            ))
        })?;
    let mut out = child.stdout.take().expect("piped");
    let mut text = Vec::new();
    let run = async {
        let _ = out.read_to_end(&mut text).await;
        child.wait().await
    };
    let status = match tokio::time::timeout(hc.timeout, run).await {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(Unhealthy(format!("health check {:?}: {e}", hc.command))),
        Err(_) => {
            if let Some(pid) = child.id() {
                // SAFETY: kill has no memory effects; the group is the check's own.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            return Err(Unhealthy(format!(
                "health check {:?} took longer than {} s{}",
                hc.command,
                hc.timeout.as_secs_f64(),
                tail(&text)
            )));
        }
    };
    if status.success() {
        crate::output::debug(format_args!("health check {:?} passed", hc.command));
        return Ok(());
    }
    let how = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => crate::exit::signal_name(sig),
        _ => "failed".to_string(),
    };
    Err(Unhealthy(format!(
        "health check {:?} failed with {how}{}",
        hc.command,
        tail(&text)
    )))
}

/// Runs the check every interval; resolves with the first failure.
pub async fn watch(hc: &HealthCheck) -> Unhealthy {
    loop {
        tokio::time::sleep(hc.interval).await;
        if let Err(unhealthy) = check(hc).await {
            return unhealthy;
        }
    }
}

/// The output's last lines, as ": a | b | c" (nothing when it printed nothing).
fn tail(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    match lines.len() {
        0 => String::new(),
        n => format!(": {}", lines[n.saturating_sub(TAIL_LINES)..].join(" | ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hc(command: &str, timeout: f64) -> HealthCheck {
        HealthCheck {
            command: command.into(),
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs_f64(timeout),
        }
    }

    #[tokio::test]
    async fn a_check_passes_on_exit_0_and_fails_with_its_code_and_last_lines() {
        assert_eq!(check(&hc("true", 5.0)).await, Ok(()));
        let Unhealthy(why) = check(&hc(
            "for i in 1 2 3 4 5 6 7; do echo line $i; done; echo gpu 3 lost >&2; exit 3",
            5.0,
        ))
        .await
        .unwrap_err();
        assert!(why.contains("failed with exit code 3"), "{why}");
        assert!(
            why.ends_with(": line 4 | line 5 | line 6 | line 7 | gpu 3 lost"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_check_that_outlives_its_timeout_fails_and_is_killed_with_its_children() {
        let started = std::time::Instant::now();
        let Unhealthy(why) = check(&hc("echo probing; sleep 30 & sleep 30", 0.3))
            .await
            .unwrap_err();
        assert!(why.contains("took longer than 0.3 s: probing"), "{why}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
