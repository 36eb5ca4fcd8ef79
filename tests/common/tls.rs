//! Test PKI made with the `openssl` command line, and an etcd launcher that takes extra
//! arguments and a client URL scheme (for `https` with client-certificate authentication).

use std::ffi::OsString;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use std::time::Duration;

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique(tag: &str) -> String {
    format!(
        "rdzv-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `openssl` with `args` in `dir`, panicking with its stderr on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("the openssl command line tool must be installed");
    assert!(
        out.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temporary directory holding PEM files: a CA, a server certificate for 127.0.0.1 and
/// localhost, a client certificate, and a second, unrelated CA. Removed on drop.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn generate() -> Pki {
        let dir = std::env::temp_dir().join(unique("pki"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        pki.ca("ca", "rdzv test CA");
        pki.ca("other-ca", "rdzv unrelated CA");
        pki.leaf(
            "server",
            "localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        pki.leaf("client", "rdzv-client", "extendedKeyUsage=clientAuth\n");
        pki
    }

    fn ca(&self, name: &str, cn: &str) {
        openssl(
            &self.dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
                "-days",
                "2",
                "-subj",
                &format!("/CN={cn}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
    }

    /// A key and a certificate signed by `ca`, with the given v3 extensions.
    fn leaf(&self, name: &str, cn: &str, extensions: &str) {
        let ext = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&ext),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n{extensions}"),
        )
        .unwrap();
        openssl(
            &self.dir,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-set_serial",
                &format!("{}", 1000 + SEQ.fetch_add(1, Ordering::Relaxed)),
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &format!("{name}.crt"),
            ],
        );
    }

    /// Path of a file in the PKI directory (`ca.crt`, `client.key`, ...).
    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).to_str().unwrap().to_string()
    }

    /// The PEM text of a file.
    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One etcd on free loopback ports with a temporary data directory, started with extra
/// arguments and serving clients with `scheme` (`http` or `https`); ready when etcd says so,
/// killed on drop.
pub struct EtcdWith {
    child: Option<Child>,
    pub client_port: u16,
    pub data_dir: PathBuf,
}

impl EtcdWith {
    pub fn start(scheme: &str, extra: &[OsString]) -> EtcdWith {
        let name = unique("etcd");
        let data_dir = std::env::temp_dir().join(&name);
        let _ = std::fs::remove_dir_all(&data_dir);
        let client_port = crate::free_port();
        let client = format!("{scheme}://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{}", crate::free_port());
        let (child, ready_rx) = crate::spawn_etcd(crate::EtcdCommand {
            program: None,
            name: &name,
            data_dir: &data_dir,
            client_urls: &client,
            peer_url: &peer,
            initial_cluster: &format!("{name}={peer}"),
            extra,
        });
        let mut etcd = EtcdWith {
            child: Some(child),
            client_port,
            data_dir,
        };
        if ready_rx.recv_timeout(Duration::from_secs(30)).is_err() {
            etcd.kill();
            panic!("etcd did not report ready within 30 s");
        }
        etcd
    }

    /// An etcd serving https that demands a client certificate signed by the PKI's CA.
    pub fn start_tls(pki: &Pki) -> EtcdWith {
        let args: Vec<OsString> = [
            "--cert-file",
            &pki.path("server.crt"),
            "--key-file",
            &pki.path("server.key"),
            "--client-cert-auth",
            "--trusted-ca-file",
            &pki.path("ca.crt"),
        ]
        .iter()
        .map(OsString::from)
        .collect();
        EtcdWith::start("https", &args)
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EtcdWith {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}
