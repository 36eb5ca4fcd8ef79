//! What each worker runs: PROGRAM and its arguments, under Python or as it is, and whether
//! it can be started at all (checked before joining a rendezvous others would wait on).

use crate::args::run::RunArgs;
use crate::exit::{usage, Usage};
use std::path::PathBuf;

/// What each worker executes.
#[derive(Debug)]
pub struct Program {
    /// The command: program and arguments (`python3 -u train.py --lr 0.1`).
    pub command: Vec<String>,
    /// The Python script PROGRAM names, when it runs under python3.
    pub script: Option<PathBuf>,
}

impl Program {
    /// As torchrun, PROGRAM runs under `python3 -u` (a script, or with `--module` a module),
    /// unless `--no-python`. Unlike torchrun, an executable file that is not Python (an ELF
    /// binary, a `#!` script) or a command on PATH runs as it is, so `rdzv run ./worker`
    /// needs no `--no-python`.
    pub fn from_args(a: &RunArgs) -> Result<Program, Usage> {
        if a.run_path && a.module {
            return Err(usage("--run-path and --module cannot be used together"));
        }
        if a.no_python && a.module {
            return Err(usage("--no-python and --module cannot be used together"));
        }
        let Some((program, args)) = a.command.split_first().filter(|(p, _)| !p.is_empty()) else {
            return Err(usage("PROGRAM: expected a program to run"));
        };
        let mut command = Vec::new();
        let mut script = None;
        if a.module {
            command.extend([python(), "-u".into(), "-m".into()]);
        } else if a.run_path || (!a.no_python && runs_under_python(program)) {
            command.extend([python(), "-u".into()]);
            script = Some(PathBuf::from(program));
        }
        command.push(program.clone());
        // `train.py -- --help`: torchrun (argparse) takes the `--` for the end of its own
        // options and gives the script `--help` alone.
        let args = match args.split_first() {
            Some((dashes, rest)) if dashes == "--" => rest,
            _ => args,
        };
        command.extend(args.iter().cloned());
        Ok(Program { command, script })
    }

    /// Fails early, before joining a rendezvous others would wait on, when the program cannot
    /// be started at all: not found on PATH, not a file, not executable, or a missing script.
    pub fn check(&self) -> Result<(), Usage> {
        let exe = &self.command[0];
        if find_executable(exe).is_none() {
            return Err(usage(format!(
                "PROGRAM: {exe:?} not found (no such file, or not an executable on PATH)"
            )));
        }
        match &self.script {
            Some(script) if !script.is_file() => Err(usage(format!(
                "PROGRAM: no such Python script {:?}",
                script.display()
            ))),
            _ => Ok(()),
        }
    }

    /// The program the workers run, for the failure report (`train.py`, not python3).
    pub fn name(&self) -> &str {
        let command = &self.command;
        let skip = command
            .iter()
            .position(|c| c == "-m")
            .map(|i| i + 1)
            .or_else(|| (command.len() > 2 && command[1] == "-u").then_some(2))
            .unwrap_or(0);
        command.get(skip).map_or("", String::as_str)
    }
}

/// Whether PROGRAM is a Python script: a `.py` name, or a file that the kernel cannot run by
/// itself (neither an executable ELF binary nor an executable `#!` script). A name that is no
/// file here is a command looked up on PATH.
fn runs_under_python(program: &str) -> bool {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    if program.ends_with(".py") {
        return true;
    }
    let path = std::path::Path::new(program);
    let Ok(meta) = path.metadata() else {
        // No such file: a command on PATH when it has no slash, else a missing script.
        return program.contains('/');
    };
    if !meta.is_file() {
        return false;
    }
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(path).and_then(|mut f| f.read(&mut magic));
    let native = matches!(read, Ok(n) if n >= 2 && (magic[..2] == *b"#!" || (n == 4 && magic == *b"\x7fELF")));
    !(native && meta.permissions().mode() & 0o111 != 0)
}

/// The Python that runs `.py` programs and modules: `PYTHON_EXEC`, else the `python3` beside
/// this command (a virtual environment's, where `pip install rdzv` put the command: torchrun
/// likewise runs workers under its own interpreter, so a venv's packages are there without
/// activating it), else `python3` on PATH.
fn python() -> String {
    if let Ok(python) = std::env::var("PYTHON_EXEC") {
        return python;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("python3")))
        .filter(|beside| beside.is_file())
        .map_or_else(|| "python3".into(), |beside| beside.display().to_string())
}

fn find_executable(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return crate::host::runnable(&p).then_some(p);
    }
    crate::host::executable_in(name, crate::host::path_dirs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Python script runs under python3 whatever its name; an executable ELF binary or `#!`
    /// script, or a command on PATH, runs as it is.
    #[test]
    fn a_double_dash_after_the_program_is_torchruns_end_of_options() {
        let args = |argv: &[&str]| {
            let mut all = vec!["rdzv", "run", "--no-python"];
            all.extend_from_slice(argv);
            match crate::args::try_parse_from(all).unwrap().command {
                crate::args::Command::Run(run) => Program::from_args(&run).unwrap().command,
                _ => unreachable!("a run"),
            }
        };
        assert_eq!(args(&["prog", "--", "--help"]), ["prog", "--help"]);
        assert_eq!(
            args(&["prog", "--help", "--", "x"]),
            ["prog", "--help", "--", "x"]
        );
        assert_eq!(args(&["prog", "--", "--", "x"]), ["prog", "--", "x"]);
    }

    #[test]
    fn which_programs_run_under_python() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rdzv-cli-python-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str, mode: u32| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path.display().to_string()
        };
        assert!(runs_under_python("missing.py"));
        assert!(runs_under_python(&file("train", "print(1)\n", 0o644)));
        assert!(runs_under_python(&file("train_x", "print(1)\n", 0o755)));
        assert!(!runs_under_python(&file("tool.sh", "#!/bin/sh\n", 0o755)));
        // A `#!` script that is not executable cannot run by itself: Python it is.
        assert!(runs_under_python(&file("plain.sh", "#!/bin/sh\n", 0o644)));
        let elf = file("binary", "", 0o755);
        std::fs::copy("/proc/self/exe", &elf).unwrap();
        assert!(!runs_under_python(&elf));
        assert!(!runs_under_python("sh"), "a command on PATH");
        assert!(runs_under_python(
            &dir.join("gone/train").display().to_string()
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
