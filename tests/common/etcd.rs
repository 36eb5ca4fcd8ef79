//! One test etcd server, the one implementation behind every suite's: the Rust tests use
//! `Etcd` directly, and the C++, Go and Python tests through the `etcd-test-server` program
//! (tests/fixtures/etcd-test-server.rs), which wraps it. A real etcd (the first on PATH) on
//! free loopback ports with a temporary data directory, ready when etcd says so, killed on drop
//! and with the process that started it, however that process ends.

use super::leftovers;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct Etcd {
    child: Option<Child>,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    pub name: String,
    /// The server version, as etcd logged it at its last start.
    pub version: String,
    /// More flags for etcd (`Etcd::start_with`), kept for a restart.
    flags: Vec<std::ffi::OsString>,
}

/// The ports test etcd servers are given: below rdzv's MASTER_PORT range (which starts at
/// 20000, below the kernel's ephemeral range), so neither an outgoing connection nor a node
/// picking a MASTER_PORT ever takes one.
const TEST_PORTS: std::ops::RangeInclusive<u16> = 10000..=19999;

/// Where test processes claim their etcd ports: a file per port, holding the claimer's pid.
fn claims_dir() -> PathBuf {
    std::env::temp_dir().join("rdzv-test-ports")
}

/// A port for a test's etcd: free now, and claimed by this process until `release_port` (or
/// its end), so that no other test process on the machine picks it meanwhile. A test that
/// kills its etcd starts it again on the same ports seconds later; picked the old way, a port
/// could be taken in between by another suite's etcd, and the restart failed.
pub fn free_port() -> u16 {
    let span = u32::from(TEST_PORTS.end() - TEST_PORTS.start()) + 1;
    for _ in 0..512 {
        let mut r = [0u8; 4];
        // SAFETY: writes at most r.len() bytes into r.
        unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
        let port = TEST_PORTS.start() + (u32::from_le_bytes(r) % span) as u16;
        if claim_port(port) {
            if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
                return port;
            }
            release_port(port); // in use by something else: not ours to hold
        }
    }
    panic!(
        "no free port among {TEST_PORTS:?} in 512 tries (claims in {:?})",
        claims_dir()
    );
}

/// Claims `port` for this process: a new claim, or one whose process is gone.
pub fn claim_port(port: u16) -> bool {
    use std::io::Write;
    let path = &claims_dir().join(port.to_string());
    let _ = std::fs::create_dir_all(claims_dir());
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(mut file) => {
                let _ = write!(file, "{}", std::process::id());
                return true;
            }
            Err(_) => {
                let owner = std::fs::read_to_string(path).ok();
                let owner = owner.and_then(|pid| pid.trim().parse::<u32>().ok());
                // A claimer that died (or is writing its pid this instant: left alone).
                match owner {
                    Some(pid) if !leftovers::process_alive(pid) => {
                        let _ = std::fs::remove_file(path);
                    }
                    _ => return false,
                }
            }
        }
    }
    false
}

/// The process that claims `port`, if any.
pub fn port_claimer(port: u16) -> Option<u32> {
    let pid = std::fs::read_to_string(claims_dir().join(port.to_string())).ok()?;
    pid.trim().parse().ok()
}

/// Gives back a port this process claimed.
pub fn release_port(port: u16) {
    if port_claimer(port) == Some(std::process::id()) {
        let _ = std::fs::remove_file(claims_dir().join(port.to_string()));
    }
}

/// One etcd member's command line. `client_urls` may list several URLs (comma-separated).
pub struct EtcdCommand<'a> {
    pub name: &'a str,
    pub data_dir: &'a std::path::Path,
    pub client_urls: &'a str,
    pub peer_url: &'a str,
    pub initial_cluster: &'a str,
    pub extra: &'a [std::ffi::OsString],
    /// The etcd binary; `None`: the first `etcd` on PATH.
    pub program: Option<&'a std::path::Path>,
}

/// The server version in one of etcd's startup log lines: `etcd Version: 3.4.23` (3.4) or
/// `"etcd-version":"3.7.3"` (3.5 and later, JSON).
fn version_in_log(line: &str) -> Option<&str> {
    let (_, rest) = line
        .split_once("etcd Version: ")
        .or_else(|| line.split_once("\"etcd-version\":\""))?;
    rest.split(|c: char| c == '"' || c.is_whitespace()).next()
}

/// Starts etcd (the first `etcd` on PATH) and returns it with a channel that receives its
/// version once etcd says it is ready to serve clients (its own log line, not a guessed delay).
/// Says on stderr which etcd version became ready where (shown with a failing test's output),
/// or etcd's last lines if it exits before it is ready.
pub fn spawn_etcd(cmd: EtcdCommand<'_>) -> (Child, mpsc::Receiver<String>) {
    leftovers::remove_data_dirs_of_dead_processes();
    let mut etcd = Command::new(cmd.program.unwrap_or(std::path::Path::new("etcd")));
    etcd.args(["--name", cmd.name, "--data-dir"])
        .arg(cmd.data_dir)
        .args(["--listen-client-urls", cmd.client_urls])
        .args(["--advertise-client-urls", cmd.client_urls])
        .args(["--listen-peer-urls", cmd.peer_url])
        .args(["--initial-advertise-peer-urls", cmd.peer_url])
        .args(["--initial-cluster", cmd.initial_cluster])
        .args(cmd.extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = spawn(etcd).expect("etcd must be installed (Debian package etcd-server)");
    let stderr = child.stderr.take().unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let urls = cmd.client_urls.to_string();
    std::thread::spawn(move || {
        let mut version = None;
        let mut ready = false;
        let mut tail = std::collections::VecDeque::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if ready {
                continue; // drained so that etcd never blocks on a full pipe
            }
            if version.is_none() {
                version = version_in_log(&line).map(str::to_string);
            }
            if line.contains("ready to serve client requests") {
                ready = true;
                let version = version.take().unwrap_or("(version not logged)".into());
                eprintln!("etcd {version} ready at {urls}");
                let _ = ready_tx.send(version);
            } else if tail.len() == 20 {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        if !ready {
            let tail: Vec<_> = tail.into();
            eprintln!(
                "etcd at {urls} exited before it was ready; its last lines:\n{}",
                tail.join("\n")
            );
        }
    });
    (child, ready_rx)
}

/// Starts `command` as a child that dies with this test process, however the process ends
/// (a failed assertion, a watchdog, SIGKILL): no etcd or node outlives its test. And with
/// SIGINT, SIGTERM, SIGHUP and SIGQUIT at their defaults, whatever the test runner inherited
/// (a background job ignores SIGINT), so a test's signals do what it expects.
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, and test threads end
/// with their test: children are forked by one thread that lives as long as the process.
pub fn spawn(mut command: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::{Mutex, OnceLock};
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let test_process = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec, only async-signal-safe calls (prctl, signal, getppid,
    // _exit).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                libc::signal(sig, libc::SIG_DFL);
            }
            // The test process died before prctl took effect: nothing would kill this child.
            if libc::getppid() != test_process {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("child-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("a thread to spawn children from");
        Mutex::new(tx)
    });
    let (reply, child) = mpsc::channel();
    spawner
        .lock()
        .unwrap()
        .send((command, reply))
        .expect("the spawner thread lives as long as the process");
    child.recv().expect("the spawner thread answers")
}

/// `spawn` at the end of a builder chain: `Command::new(x).arg(y).spawn_tied()`.
pub trait SpawnTied {
    fn spawn_tied(&mut self) -> std::io::Result<Child>;
}

impl SpawnTied for Command {
    fn spawn_tied(&mut self) -> std::io::Result<Child> {
        spawn(std::mem::replace(self, Command::new("")))
    }
}

/// Makes names and run ids unique in this process.
pub static SEQ: AtomicU32 = AtomicU32::new(0);

impl Etcd {
    pub fn start() -> Etcd {
        Etcd::start_with(&[])
    }

    /// Starts etcd with more flags, such as `--quota-backend-bytes=16777216`.
    pub fn start_with(flags: &[&str]) -> Etcd {
        let name = format!(
            "rdzv-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let data_dir = std::env::temp_dir().join(&name);
        let _ = std::fs::remove_dir_all(&data_dir);
        let mut etcd = Etcd {
            child: None,
            client_port: free_port(),
            peer_port: free_port(),
            data_dir,
            name,
            version: String::new(),
            flags: flags.iter().map(Into::into).collect(),
        };
        etcd.launch_on_free_ports();
        etcd
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// False after `kill` (until `restart`).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The etcd process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("etcd is running").id()
    }

    /// etcd's Prometheus metrics (served on the client URL), as text.
    fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(self.endpoint()).expect("etcd metrics");
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        conn.read_to_string(&mut body).expect("etcd metrics");
        body
    }

    /// One value of etcd's Prometheus metrics, e.g. `etcd_debugging_mvcc_events_total` (watch
    /// events sent) or `..._watcher_total`.
    pub fn metric(&self, name: &str) -> i64 {
        self.metrics()
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("etcd reports no metric {name}")) as i64
    }

    /// The sum of every series of the metric `name` whose labels contain all of `labels`
    /// (for example `grpc_server_handled_total` with `grpc_method="Range"`).
    pub fn metric_sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| labels.iter().all(|label| l.contains(label)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// A rendezvous URL on this server with a run id unique to the calling test.
    pub fn url(&self, run: &str, query: &str) -> String {
        format!(
            "etcd://{}/{run}-{}?{query}",
            self.endpoint(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Starts etcd on fresh ports, again if it exits before it is ready: a port picked free can
    /// be taken (by another test's server or an outgoing connection) before etcd binds it.
    fn launch_on_free_ports(&mut self) {
        for attempt in 1.. {
            match self.try_launch() {
                Ok(()) => return,
                Err(why) if attempt < 3 => {
                    eprintln!("{why}; starting it again on other ports");
                    release_port(self.client_port);
                    release_port(self.peer_port);
                    self.client_port = free_port();
                    self.peer_port = free_port();
                    let _ = std::fs::remove_dir_all(&self.data_dir);
                }
                Err(why) => panic!("{why} (3 times)"),
            }
        }
    }

    fn launch(&mut self) {
        if let Err(why) = self.try_launch() {
            panic!("{why}");
        }
    }

    fn try_launch(&mut self) -> Result<(), String> {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let (child, ready_rx) = spawn_etcd(EtcdCommand {
            program: None,
            name: &self.name,
            data_dir: &self.data_dir,
            client_urls: &client,
            peer_url: &peer,
            initial_cluster: &format!("{}={peer}", self.name),
            extra: &self.flags,
        });
        self.child = Some(child);
        match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(version) => {
                self.version = version;
                Ok(())
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                self.kill();
                Err(format!("etcd exited before it was ready on {client}"))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("etcd did not report ready within 30 s")
            }
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same ports and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Sends `signal` to the etcd process (SIGSTOP freezes it: requests hang, as with a server
    /// that stopped answering; SIGCONT resumes it). A SIGSTOP returns once every thread of etcd
    /// is stopped: kill() returns before that, and a thread running on another core answered a
    /// request sent just after it (the Go binding's frozen-etcd test got an answer 10 ms
    /// later).
    pub fn signal(&self, signal: i32) {
        if let Err(err) = self.try_signal(signal) {
            panic!("signal {signal} to etcd: {err}");
        }
    }

    /// `signal` for a caller that reports the failure (the etcd-test-server fixture): the
    /// same wait for a SIGSTOP to take hold, so the other suites' frozen etcd is frozen too.
    pub fn try_signal(&self, signal: i32) -> std::io::Result<()> {
        let Some(child) = self.child.as_ref() else {
            return Err(std::io::Error::other("etcd is not running (killed)"));
        };
        let pid = child.id();
        // SAFETY: a signal to our own child, which is not yet reaped.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if signal == libc::SIGSTOP {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !all_threads_stopped(pid) {
                if Instant::now() >= deadline {
                    return Err(std::io::Error::other(format!(
                        "etcd {pid} not stopped 10 s after SIGSTOP"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    }
}

/// Whether every thread of `pid` is stopped (state `T` or `t` in /proc/PID/task/*/stat).
pub fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            // pid (comm) state ...: comm may hold spaces, so read after its ')'.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            matches!(state, Some("T") | Some("t"))
        })
    })
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        release_port(self.client_port);
        release_port(self.peer_port);
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}
