//! How the `rdzv` command ends: its exit statuses, the usage error that becomes status 2, and
//! the names of the signals behind a 128+N.
//!
//! The statuses are the contract a scheduler reads, the same on every path: 0 success, 1 a
//! runtime failure (workers failed, etcd unreachable), 2 a usage error (found before anything
//! starts), 128+N stopped by signal N (as a shell reports a process killed by it).

/// The command's exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Success,
    /// A runtime failure: the workers failed, etcd could not be reached, a file not written.
    Failure,
    /// The command line (or a `PET_*` variable) asks for something that cannot be done.
    Usage,
    /// Stopped by this signal (its number).
    Signal(i32),
}

impl Exit {
    pub fn code(self) -> i32 {
        match self {
            Exit::Success => 0,
            Exit::Failure => 1,
            Exit::Usage => 2,
            Exit::Signal(sig) => 128 + sig,
        }
    }
}

/// A usage error: one line naming the flag and the form it expects. It is also the error
/// type of the typed flag parsers, so clap hands it back whole (`args::parse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

pub fn usage(message: impl Into<String>) -> Usage {
    Usage(message.into())
}

/// A signal's name (`SIGTERM`), or its number when it has none here.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        _ => return format!("{signal}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_the_documented_numbers() {
        assert_eq!(Exit::Success.code(), 0);
        assert_eq!(Exit::Failure.code(), 1);
        assert_eq!(Exit::Usage.code(), 2);
        assert_eq!(Exit::Signal(libc::SIGTERM).code(), 143);
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(63), "63");
    }
}
