//! The error family shared by every layer: a kind that maps one-to-one onto the C status codes
//! and a message written for the person reading a log.

use std::fmt;

/// What went wrong, in the terms of torchelastic's rendezvous exceptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// An argument or option was missing, malformed or out of range.
    InvalidArgument,
    /// The run was closed (`set_closed`) before or while this call ran.
    Closed,
    /// The call did not complete before its deadline.
    Timeout,
    /// etcd could not be reached or refused the request after retries.
    Connection,
    /// Data under the run's prefix is corrupt or was written by something else.
    State,
    /// The run closed while this node waited outside the running round (late or surplus).
    GracefulExit,
    /// The handle was shut down (possibly from another thread) during or before the call.
    Shutdown,
    /// `cancel` was called while `next` was blocked; the handle stays usable.
    Cancelled,
    /// This node's etcd lease expired (it was cut off from etcd for longer than `lease_ttl`);
    /// the others have dropped it. Reported to C as a connection error.
    LeaseLost,
    /// A bug in rdzv (for example a caught panic).
    Internal,
}

/// An error with its kind and a readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn closed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Closed, message)
    }
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }
    pub fn connection(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Connection, message)
    }
    pub fn state(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::State, message)
    }
    pub fn shutdown() -> Self {
        Self::new(ErrorKind::Shutdown, "the rendezvous handle was shut down")
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
