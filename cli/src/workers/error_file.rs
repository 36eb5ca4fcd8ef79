//! torchelastic's error file (`error.json`), the one place that knows its form: read for the
//! failure report, written for a hung worker (which wrote none of its own), and copied into
//! the launcher's own `TORCHELASTIC_ERROR_FILE` as torchrun copies it. The nested form is
//! torch's `@record`: `{"message": {"message": "...", "extraInfo": {"py_callstack": "...",
//! "timestamp": "..."}, "errorCode": N}}`; older writers use the flat `{"message": "...",
//! "timestamp": N}`.

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// What a torchelastic error file says.
pub struct ErrorFile {
    pub message: String,
    pub at: Option<SystemTime>,
    pub traceback: Option<String>,
}

/// The message, timestamp and traceback in a torchelastic error file, if the worker wrote one:
/// `{"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}`
/// or the flat form `{"message": "...", "timestamp": N}`.
pub fn read(path: &Path) -> Option<ErrorFile> {
    let bytes = std::fs::read(path).ok()?;
    let v: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) => {
            return Some(ErrorFile {
                message: String::from_utf8_lossy(&bytes).trim().to_string(),
                at: None,
                traceback: None,
            })
        }
    };
    let (message, timestamp, traceback) = match v.get("message") {
        Some(Value::Object(m)) => {
            let extra = m.get("extraInfo");
            (
                m.get("message")
                    .and_then(|s| s.as_str())
                    .map(str::to_string),
                extra.and_then(|e| e.get("timestamp")).cloned(),
                extra
                    .and_then(|e| e.get("py_callstack"))
                    .and_then(|t| t.as_str())
                    .map(str::to_string),
            )
        }
        Some(Value::String(s)) => (Some(s.clone()), v.get("timestamp").cloned(), None),
        _ => (None, None, None),
    };
    let seconds = timestamp.and_then(|t| match t {
        Value::String(s) => s.parse::<u64>().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    });
    Some(ErrorFile {
        message: message.unwrap_or_else(|| v.to_string()),
        at: seconds.map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
        traceback,
    })
}

/// Writes an error file in torch's nested form: `message`, the traceback (`py_callstack`) and
/// now as its time.
pub fn write(path: &Path, message: &str, traceback: &str) -> std::io::Result<()> {
    std::fs::write(
        path,
        nested(message, traceback, SystemTime::now(), None).to_string(),
    )
}

fn nested(message: &str, traceback: &str, at: SystemTime, code: Option<i32>) -> Value {
    let seconds = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut v = json!({"message": {
        "message": message,
        "extraInfo": {"py_callstack": traceback, "timestamp": seconds.to_string()},
    }});
    if let Some(code) = code {
        v["message"]["errorCode"] = json!(code);
    }
    v
}

/// torchrun's copy of the root cause's error file into the launcher's own (`to`): the
/// worker's file (`from`) as it is with its exit code added (`errorCode`), or, when it wrote
/// none, an error of the launcher's own saying `why`.
pub fn copy_with_code(
    from: Option<&Path>,
    to: &Path,
    code: i32,
    why: &str,
    at: SystemTime,
) -> std::io::Result<()> {
    let written = from
        .and_then(|path| std::fs::read(path).ok())
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
    let json = match written {
        Some(mut v) => {
            if let Some(m) = v.get_mut("message").and_then(|m| m.as_object_mut()) {
                m.entry("errorCode").or_insert(json!(code));
            }
            v
        }
        None => nested(why, "", at, Some(code)),
    };
    if let Some(dir) = to.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(to, json.to_string())
}
