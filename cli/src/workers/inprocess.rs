//! In-process restart (`--in-process-restart`): where each worker's control file is (beside
//! its error file, in the worker's directory). The file itself, both its sides, is the
//! library's (`rdzv::inprocess`), so that the launcher and a worker in C, C++ or Go read and
//! write it alike.

use std::path::{Path, PathBuf};

pub use rdzv::inprocess::{
    clear, has_left, write_leave as leave, write_run as run, CONTROL_FILE_ENV,
};

/// A worker's control file: beside its error file.
pub fn control_file(error_file: &Path) -> PathBuf {
    error_file.with_file_name("inprocess.json")
}
