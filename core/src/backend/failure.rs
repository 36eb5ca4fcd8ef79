//! What an etcd failure means: whether retrying can mend it (`classify`), and the rdzv error
//! it becomes (`to_error`), naming the endpoints and the operation, never the credentials.

use crate::error::{Error, ErrorKind};

pub(super) enum Failure {
    Transient,
    Permanent,
}

pub(super) fn classify(err: &etcd_client::Error) -> Failure {
    use etcd_client::Error as E;
    use tonic::Code;
    match err {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            Failure::Transient
        }
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Cancelled => {
                Failure::Transient
            }
            // A learner (a member being added) refuses all but serializable reads, as
            // Unavailable up to etcd 3.5 but FailedPrecondition from 3.6: another endpoint, or
            // the member once promoted, can answer.
            Code::FailedPrecondition if status.message().contains("not supported for learner") => {
                Failure::Transient
            }
            Code::Unknown | Code::Internal | Code::ResourceExhausted => {
                let m = status.message();
                if m.contains("leader")
                    || m.contains("timed out")
                    || m.contains("too many requests")
                    || m.contains("transport")
                    || m.contains("connection")
                {
                    Failure::Transient
                } else {
                    Failure::Permanent
                }
            }
            _ => Failure::Permanent,
        },
        _ => Failure::Permanent,
    }
}

/// Maps an etcd failure onto rdzv's family, naming the endpoints and never the credentials.
pub fn to_error(endpoints: &str, what: &str, err: &etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    use tonic::Code;
    if let E::GRpcStatus(status) = err {
        let m = status.message();
        match status.code() {
            Code::NotFound if m.contains("lease not found") => {
                return Error::new(
                    ErrorKind::LeaseLost,
                    "an etcd lease of this node (its own, or the run's) expired: etcd did not hear from it within the lease's TTL",
                )
            }
            Code::InvalidArgument if m.contains("too large") => {
                return Error::invalid(format!("{what}: request too large for etcd ({m})"))
            }
            // The answer is larger than the client decodes: rdzv writes nothing that large, so
            // the run's keys hold data that something else wrote. Corrupt state, not a
            // connection that retrying or reconnecting would mend.
            Code::OutOfRange if m.contains("decoded message length too large") => {
                return Error::state(format!(
                    "{what}: etcd's answer is larger than rdzv reads ({m}): a key of the run holds data rdzv did not write"
                ))
            }
            // Not retried: nothing frees space but an operator, so every write fails at once
            // until the alarm is cleared.
            Code::ResourceExhausted if m.contains("database space exceeded") => {
                return Error::connection(format!(
                    "etcd at {endpoints} refused {what}: {m}: its database reached its quota \
                     (NOSPACE alarm) and it takes no writes until an operator compacts its \
                     history, defragments every member and disarms the alarm (etcdctl compact, \
                     etcdctl defrag, etcdctl alarm disarm; see OPERATIONS.md in rdzv's docs)"
                ))
            }
            Code::PermissionDenied
            | Code::Unauthenticated
            | Code::FailedPrecondition
            | Code::InvalidArgument
                if m.contains("permission") || m.contains("auth") || m.contains("user") || m.contains("password") || m.contains("token") =>
            {
                return Error::connection(format!(
                    "etcd at {endpoints} refused {what}: {m} (check username/password and role permissions)"
                ))
            }
            _ => {}
        }
    }
    // A gRPC status prints as a debug dump (metadata, details); its message is what matters.
    let cause = match err {
        E::GRpcStatus(status) => format!("{} ({:?})", status.message(), status.code()),
        other => error_chain(other),
    };
    Error::connection(format!("etcd at {endpoints} failed {what}: {cause}"))
}

/// etcd's message for a read at a revision its history no longer holds (`ErrCompacted`).
const COMPACTED: &str = "required revision has been compacted";

/// True when `err` is etcd refusing a read at a revision it has compacted away: reading again
/// at a fresh revision succeeds.
pub(crate) fn is_compacted(err: &Error) -> bool {
    err.kind() == ErrorKind::Connection && err.message().contains(COMPACTED)
}

/// An error with all its causes, which is what a person needs to see ("connection refused",
/// "invalid peer certificate") rather than the outer wrapper alone.
pub(super) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}
