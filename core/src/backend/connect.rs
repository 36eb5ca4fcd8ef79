//! Opening the connection a process shares per endpoint set and credentials: reused while any
//! handle holds it, one connect at a time per key, an endpoint that refuses TCP failing at
//! once, and a TLS failure explained from one direct handshake (the balanced channel retries
//! them silently).

use super::failure::{classify, error_chain, to_error, Failure};
use super::{backoff, keys, lease, watch, Connection, Etcd, Who, LOG_TARGET};
use crate::error::{Error, ErrorKind, Result};
use crate::params::{Params, Security};
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Clone, PartialEq, Eq, Hash)]
struct ConnectionKey {
    pid: u32,
    endpoints: Vec<String>,
    https: bool,
    cacert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

static CONNECTIONS: Lazy<Mutex<HashMap<ConnectionKey, Weak<Connection>>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

/// One connect at a time per connection key: handles created at once in one process wait for
/// the first one's connection instead of each opening their own.
static CONNECTING: Lazy<Mutex<HashMap<ConnectionKey, Arc<tokio::sync::Mutex<()>>>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

impl Etcd {
    /// Connects (or reuses this process's connection) and checks that etcd answers, retrying
    /// until `connect_timeout`.
    pub async fn connect(params: &Params) -> Result<Etcd> {
        let key = connection_key(params);
        let attempt_timeout = params.connect_timeout();
        let reuse = |key: &ConnectionKey| {
            let cached = CONNECTIONS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(key)
                .and_then(Weak::upgrade);
            cached.map(|shared| Etcd {
                shared,
                attempt_timeout,
                restart_on_new_term: false,
                who: Who::default(),
            })
        };
        if let Some(etcd) = reuse(&key) {
            return Ok(etcd);
        }
        let endpoints = params.endpoints().join(",");
        let deadline = Instant::now() + params.connect_timeout();
        let gate = CONNECTING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        // Waiting counts against this caller's own connect_timeout: if the connect ahead of it
        // hangs until its own timeout, this one fails at its deadline instead of queueing.
        let Ok(_one_at_a_time) = tokio::time::timeout_at(deadline, gate.lock()).await else {
            return Err(unreachable(&endpoints, params.connect_timeout()));
        };
        if let Some(etcd) = reuse(&key) {
            return Ok(etcd);
        }
        let options = connect_options(params)?;
        let urls: Vec<String> = params
            .endpoints()
            .iter()
            .map(|e| match (e.contains("://"), params.security().https) {
                (true, _) => e.clone(),
                (false, true) => format!("https://{e}"),
                (false, false) => format!("http://{e}"),
            })
            .collect();
        refuse_fast(params.endpoints(), deadline).await?;
        let mut attempt = 0u32;
        let client = loop {
            let try_connect = Client::connect(urls.clone(), Some(options.clone()));
            let err = match tokio::time::timeout_at(deadline, try_connect).await {
                Ok(Ok(client)) => break client,
                Ok(Err(e)) => e,
                Err(_) => return Err(unreachable(&endpoints, params.connect_timeout())),
            };
            match classify(&err) {
                Failure::Transient if Instant::now() < deadline => {
                    backoff(&mut attempt, deadline).await;
                }
                _ => return Err(to_error(&endpoints, "connect", &err)),
            }
        };
        // Best effort and bounded: the version is for the log only.
        let version = match tokio::time::timeout_at(deadline, client.clone().status()).await {
            Ok(Ok(status)) => status.version().to_string(),
            _ => "unknown".to_string(),
        };
        // Lazily-connecting channels report nothing until used: ask for a key to be sure. The
        // key is inside the run's namespace, so a user whose role covers only that prefix
        // passes.
        let probe = keys::Keys::new(params.key_prefix(), params.run_id()).current();
        let shared = Arc::new(Connection {
            client,
            endpoints,
            version,
            term: tokio::sync::watch::Sender::new(0),
            next_term_probe: Mutex::new(Instant::now()),
            term_probe_key: probe.clone(),
            keep_alives: lease::KeepAlives::default(),
            watches: watch::Watches::default(),
        });
        // The node has no id yet; the run names whose connection this is in retry records.
        let etcd = Etcd {
            shared: shared.clone(),
            attempt_timeout,
            restart_on_new_term: false,
            who: Who {
                run: Some(params.run_id().into()),
                ..Who::default()
            },
        };
        let probed = etcd
            .get(
                deadline,
                "connect",
                probe,
                etcd_client::GetOptions::new().with_count_only(),
            )
            .await;
        if let Err(err) = probed {
            let tls_cause = match params.security().https && err.kind() == ErrorKind::Connection {
                true => tls_diagnosis(params).await,
                false => None,
            };
            return Err(match tls_cause {
                Some(cause) => Error::connection(format!("{} (TLS: {cause})", err.message())),
                None => err,
            });
        }
        tracing::debug!(target: LOG_TARGET, endpoints = %etcd.endpoints(), etcd_version = %etcd.server_version(),
            "opened a connection to etcd");
        let mut connections = CONNECTIONS.lock().unwrap_or_else(|e| e.into_inner());
        connections.retain(|_, w| w.strong_count() > 0);
        connections.insert(key, Arc::downgrade(&shared));
        Ok(etcd)
    }
}

/// Fails at once, with a message that says what to check, when every endpoint refuses TCP
/// connections: nothing listens there, and waiting out `connect_timeout` would only hide that.
/// Anything else (an endpoint that accepts, a timeout, a name that does not resolve yet) is
/// left to the normal retries. The endpoints are probed at once, each until `deadline`: a
/// refusal comes back at once from the kernel, so no shorter timer is needed, and one that
/// fired on a loaded machine before the refusal arrived turned it into a 10 s timeout.
async fn refuse_fast(endpoints: &[String], deadline: Instant) -> Result<()> {
    let mut probes = tokio::task::JoinSet::new();
    for (index, endpoint) in endpoints.iter().enumerate() {
        let host_port = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, rest)| rest)
            .trim_end_matches('/')
            .to_string();
        probes.spawn(async move {
            let refused = matches!(
                tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(&host_port)).await,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
            );
            (index, host_port, refused)
        });
    }
    let mut refused = Vec::new();
    while let Some(probe) = probes.join_next().await {
        match probe {
            Ok((index, host_port, true)) => refused.push((index, host_port)),
            // One endpoint answered (or may yet): the normal path takes over.
            _ => return Ok(()),
        }
    }
    refused.sort(); // in the order the endpoints were given
    let refused: Vec<String> = refused
        .into_iter()
        .map(|(_, host_port)| host_port)
        .collect();
    Err(Error::connection(format!(
        "connection refused at {}: is etcd running there? (check the endpoint's host and port)",
        refused.join(", ")
    )))
}

fn unreachable(endpoints: &str, connect_timeout: Duration) -> Error {
    Error::connection(format!(
        "etcd at {endpoints} unreachable: no connection within {:.1} s",
        connect_timeout.as_secs_f64()
    ))
}

fn connection_key(params: &Params) -> ConnectionKey {
    let s = params.security();
    ConnectionKey {
        pid: std::process::id(),
        endpoints: params.endpoints().to_vec(),
        https: s.https,
        cacert: s.cacert.clone(),
        cert: s.cert.clone(),
        key: s.key.clone(),
        username: s.username.clone(),
        password: s.password.clone(),
    }
}

fn connect_options(params: &Params) -> Result<ConnectOptions> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(params.connect_timeout())
        // HTTP/2 pings notice a dead etcd or a cut network on idle watch streams.
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5))
        .with_keep_alive_while_idle(true);
    let Security {
        https,
        username,
        password,
        ..
    } = params.security();
    if *https {
        options = options.with_tls(tls_options(params)?);
    }
    if let Some(user) = username {
        options = options.with_user(user.clone(), password.clone().unwrap_or_default());
    }
    Ok(options)
}

fn tls_options(params: &Params) -> Result<TlsOptions> {
    let Security {
        cacert, cert, key, ..
    } = params.security();
    let mut tls = TlsOptions::new();
    if let Some(path) = cacert {
        tls = tls.ca_certificate(Certificate::from_pem(read_pem(
            "cacert",
            path,
            "CERTIFICATE",
        )?));
    }
    if let (Some(cert), Some(key)) = (cert, key) {
        let cert = read_pem("cert", cert, "CERTIFICATE")?;
        let key = read_pem("key", key, "PRIVATE KEY")?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

/// Why a TLS endpoint refuses us, learnt from one direct connection. The client's balanced
/// channel retries failed handshakes silently, so without this a wrong CA or a missing client
/// certificate would look like a plain timeout.
async fn tls_diagnosis(params: &Params) -> Option<String> {
    let first = params.endpoints().first()?;
    let url = match first.contains("://") {
        true => first.clone(),
        false => format!("https://{first}"),
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url)
        .ok()?
        .tls_config(tls_options(params).ok()?)
        .ok()?
        .connect_timeout(Duration::from_secs(3));
    match tokio::time::timeout(Duration::from_secs(5), endpoint.connect()).await {
        Ok(Err(e)) => Some(error_chain(&e)),
        // The handshake passed (or hung): the server likely wants a client certificate.
        _ if params.security().cert.is_none() => {
            Some("no client certificate was given; set cert and key if etcd requires one".into())
        }
        _ => None,
    }
}

/// Reads a PEM file and checks it holds what the option expects (a swapped cert and key
/// otherwise surfaces as an opaque "transport error"). Errors never show the contents.
fn read_pem(option: &str, path: &str, kind: &str) -> Result<Vec<u8>> {
    let pem = read_file(option, path)?;
    let begin = format!("-----BEGIN {kind}-----");
    // Keys come as "BEGIN PRIVATE KEY", "BEGIN RSA PRIVATE KEY", "BEGIN EC PRIVATE KEY".
    let end_marker = format!("{kind}-----");
    let text = String::from_utf8_lossy(&pem);
    let holds = text.lines().any(|l| {
        l.starts_with("-----BEGIN ")
            && (l == begin || (kind == "PRIVATE KEY" && l.ends_with(&end_marker)))
    });
    if !holds {
        return Err(Error::invalid(format!(
            "option {option}: {path:?} does not hold a PEM {}",
            kind.to_lowercase()
        )));
    }
    Ok(pem)
}

/// Reads a TLS file; the error names the option and path, never the contents.
fn read_file(option: &str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::invalid(format!("option {option}: cannot read {path:?}: {e}")))
}
