//! `rdzv_set_log_handler`: the library's log records, handed to the host's own logging.

use rdzv::log::{set_handler, Record};
use std::ffi::{c_char, c_void, CString};
use tracing::Level;

/// Severity of a log record. Values are fixed.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rdzv_log_level_t {
    RDZV_LOG_ERROR = 1,
    RDZV_LOG_WARN = 2,
    RDZV_LOG_INFO = 3,
    RDZV_LOG_DEBUG = 4,
    RDZV_LOG_TRACE = 5,
}

/// Receives one log record: its level, its target (the library module that made it, e.g.
/// `"rdzv::rendezvous"`) and its line (the message, then `name=value` fields such as
/// `run=`, `node=`, `round=`), both NUL-terminated UTF-8 valid only during the call, and the
/// `user_data` given to `rdzv_set_log_handler`.
pub type rdzv_log_handler_t = Option<
    unsafe extern "C" fn(
        level: rdzv_log_level_t,
        target: *const c_char,
        line: *const c_char,
        user_data: *mut c_void,
    ),
>;

/// The host's pointer, handed back untouched; the host vouches that it may be used from
/// any thread.
struct UserData(*mut c_void);
// SAFETY: never dereferenced by rdzv; rdzv_set_log_handler's contract makes the host
// responsible for its use from the threads that log.
unsafe impl Send for UserData {}
unsafe impl Sync for UserData {}

impl UserData {
    /// Through a method, so closures capture the whole (Send) wrapper, not its field.
    fn get(&self) -> *mut c_void {
        self.0
    }
}

/// Sends the library's log records to `handler` instead of stderr; NULL goes back to stderr.
/// Which records exist is set by the `RDZV_LOG` environment variable, read once, at the
/// process's first call into rdzv: warnings by default; `RDZV_LOG=info` gives one line per
/// event of a round, `RDZV_LOG=debug` adds retried etcd requests and how long waits took,
/// `RDZV_LOG=rdzv::rendezvous=trace` narrows to one module (filter syntax of
/// `tracing-subscriber`; modules not named keep warnings). Nothing is logged per store call at
/// `info`. Never fails.
///
/// Threads: `handler` is called on the thread that made the record: one of the library's own
/// threads, or a thread of the host inside an rdzv call. It may run on several threads at
/// once, so it and `user_data` must be thread-safe. A record is handed over before the code
/// that made it goes on, so records made one after the other (one node's, for instance)
/// arrive in that order. No lock is held while it runs, but a slow handler slows the thread
/// it runs on: return quickly (queue the record if the host's logging may block).
///
/// Reentrancy: the handler may call any rdzv function, `rdzv_set_log_handler` included.
/// Records that such calls make on the handler's own thread are dropped (the handler never
/// runs inside itself); their work on other threads logs normally.
///
/// Replacing: `rdzv_set_log_handler` swaps the handler at once (records made from then on go
/// to the new one) and returns when no other thread is still running the previous one, which
/// is then never called again: its `user_data` may be freed. Called from inside the previous
/// handler, it waits for the other threads only. Do not call it while holding a lock that the
/// handler takes: it would wait for a handler that waits for that lock.
///
/// Failures: the handler must not unwind into rdzv (no C++ exception, no longjmp); a Rust
/// panic in it is caught and the record dropped.
#[no_mangle]
pub extern "C" fn rdzv_set_log_handler(handler: rdzv_log_handler_t, user_data: *mut c_void) {
    rdzv::log::install_default();
    let Some(handler) = handler else {
        set_handler(None);
        return;
    };
    let user_data = UserData(user_data);
    set_handler(Some(std::sync::Arc::new(move |record: &Record<'_>| {
        let level = match record.level {
            Level::ERROR => rdzv_log_level_t::RDZV_LOG_ERROR,
            Level::WARN => rdzv_log_level_t::RDZV_LOG_WARN,
            Level::INFO => rdzv_log_level_t::RDZV_LOG_INFO,
            Level::DEBUG => rdzv_log_level_t::RDZV_LOG_DEBUG,
            Level::TRACE => rdzv_log_level_t::RDZV_LOG_TRACE,
        };
        let text = |s: &str| CString::new(s.replace('\0', " ")).unwrap_or_default();
        let (target, line) = (text(record.target), text(record.line));
        // SAFETY: the host's function, called as rdzv_set_log_handler documents.
        unsafe { handler(level, target.as_ptr(), line.as_ptr(), user_data.get()) };
    })));
}
