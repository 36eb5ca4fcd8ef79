//! Transport security and authentication against a real etcd: TLS with client certificates
//! (and what happens with the wrong CA, no client certificate or a missing file), and etcd
//! users whose roles confine them to one run's prefix.

use crate::common;
use rdzv_test_support::tls;

use common::{on_threads, Etcd};
use etcd_client::{Client, ConnectOptions, GetOptions, Permission};
use rdzv::{BlockingRendezvous, ErrorKind, Params};
use std::future::Future;
use std::time::{Duration, Instant};
use tls::{EtcdWith, Pki};

/// A connect that must succeed gets this long (seconds): with users, each connect
/// authenticates (a bcrypt hash in etcd), and on 2 cores busy with the test command's other
/// lanes three such connects once took more than 3 s.
const OK_CONNECT: u32 = 30;

/// Every failing connect here uses connect_timeout=3; it must give up within this.
const FAIL_BOUND: Duration = Duration::from_secs(6);

fn block_on<T>(fut: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), fut).await })
        .expect("etcd admin request did not finish within 20 s")
}

/// Creating a handle must fail; returns the error and how long it took.
fn connect_fails(url: &str) -> (rdzv::Error, Duration) {
    let params = Params::from_url(url).unwrap();
    let started = Instant::now();
    let err = match BlockingRendezvous::new(params) {
        Ok(_) => panic!("connecting with {url} must fail"),
        Err(e) => e,
    };
    (err, started.elapsed())
}

/// Two nodes on threads form one round and exchange a value through the round's store.
fn two_nodes_share_a_store(url: &str) {
    let url = url.to_string();
    let got = on_threads(2, move |_| {
        let node = BlockingRendezvous::new(Params::from_url(&url).unwrap()).unwrap();
        let (info, store) = node.next().unwrap();
        if info.rank == 0 {
            store.set("greeting", b"hello over the wire").unwrap();
        }
        let value = store
            .get("greeting", Some(Duration::from_secs(10)))
            .unwrap();
        node.shutdown().unwrap();
        (info.rank, info.world_size, info.round, value)
    });
    let mut ranks: Vec<u32> = got.iter().map(|g| g.0).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1], "one round of two: {got:?}");
    for (_, world, round, value) in &got {
        assert_eq!((*world, *round), (2, got[0].2));
        assert_eq!(value.as_slice(), b"hello over the wire");
    }
}

// ---------------------------------------------------------------------------------------------
// TLS

/// Pieces of the client key's PEM body that are random key material (not the fixed PKCS#8
/// header every P-256 key shares): none may ever appear in an error message.
fn key_fragments(pki: &Pki) -> Vec<String> {
    let body: String = pki
        .read("client.key")
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    assert!(body.len() > 100, "unexpected key PEM: {body:?}");
    // The PKCS#8 prefix of an EC key is about 48 base64 characters; after it, all is secret.
    (48..body.len() - 16)
        .step_by(8)
        .map(|i| body[i..i + 16].to_string())
        .collect()
}

fn assert_no_key_material(pki: &Pki, message: &str) {
    assert!(
        !message.contains("PRIVATE KEY"),
        "error shows a PEM key: {message}"
    );
    for fragment in key_fragments(pki) {
        assert!(
            !message.contains(&fragment),
            "error shows key material {fragment:?}: {message}"
        );
    }
}

fn tls_url(etcd: &EtcdWith, run: &str, query: &str) -> String {
    format!("etcds://{}/{run}?{query}", etcd.endpoint())
}

#[test]
fn tls_with_client_certificate_forms_a_round() {
    let pki = Pki::generate();
    let etcd = EtcdWith::start_tls(&pki);
    let query = format!(
        "cacert={}&cert={}&key={}&min_nodes=2&max_nodes=2&connect_timeout=3&join_timeout=20",
        pki.path("ca.crt"),
        pki.path("client.crt"),
        pki.path("client.key")
    );
    two_nodes_share_a_store(&tls_url(&etcd, "tls-round", &query));
    // The same with protocol=https on a plain endpoint list.
    let explicit = format!(
        "etcd://{}/tls-round-2?protocol=https&{query}",
        etcd.endpoint()
    );
    two_nodes_share_a_store(&explicit);
}

#[test]
fn tls_plain_http_client_is_refused() {
    // Control for the failure tests below: etcd really serves only TLS on this port.
    let pki = Pki::generate();
    let etcd = EtcdWith::start_tls(&pki);
    let url = format!("etcd://{}/plain?connect_timeout=3", etcd.endpoint());
    let (err, took) = connect_fails(&url);
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(took < FAIL_BOUND, "took {took:?}: {err}");
    assert!(err.message().contains(&etcd.endpoint()), "{err}");
}

#[test]
fn tls_wrong_ca_is_a_connection_error_naming_the_endpoint() {
    let pki = Pki::generate();
    let etcd = EtcdWith::start_tls(&pki);
    let query = format!(
        "cacert={}&cert={}&key={}&connect_timeout=3",
        pki.path("other-ca.crt"),
        pki.path("client.crt"),
        pki.path("client.key")
    );
    let (err, took) = connect_fails(&tls_url(&etcd, "wrong-ca", &query));
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(took < FAIL_BOUND, "took {took:?}: {err}");
    assert!(
        err.message().contains(&etcd.endpoint()),
        "message must name the endpoint: {err}"
    );
    assert_no_key_material(&pki, err.message());
    assert!(
        err.message().contains("invalid peer certificate"),
        "the cause is missing: {err}"
    );
    eprintln!("wrong CA ({took:?}) -> {err}");
}

#[test]
fn tls_without_client_certificate_is_a_connection_error() {
    let pki = Pki::generate();
    let etcd = EtcdWith::start_tls(&pki);
    let query = format!("cacert={}&connect_timeout=3", pki.path("ca.crt"));
    let (err, took) = connect_fails(&tls_url(&etcd, "no-client-cert", &query));
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(took < FAIL_BOUND, "took {took:?}: {err}");
    assert!(err.message().contains(&etcd.endpoint()), "{err}");
    assert!(
        err.message().contains("client certificate"),
        "the hint is missing: {err}"
    );
    eprintln!("no client certificate ({took:?}) -> {err}");
}

#[test]
fn tls_missing_cacert_file_is_an_invalid_argument_naming_the_option() {
    let pki = Pki::generate();
    let missing = pki.path("no-such-ca.crt");
    // No etcd needed: the files are read before any connection is made. The endpoint is a
    // port nobody listens on, so a connect attempt would be a Connection error instead.
    let url = format!(
        "etcds://127.0.0.1:9/missing-ca?cacert={missing}&cert={}&key={}&connect_timeout=3",
        pki.path("client.crt"),
        pki.path("client.key")
    );
    let (err, took) = connect_fails(&url);
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("cacert"), "{err}");
    assert!(err.message().contains("no-such-ca.crt"), "{err}");
    assert!(took < FAIL_BOUND, "took {took:?}: {err}");

    // A directory is not readable as a file either.
    let url = format!(
        "etcds://127.0.0.1:9/dir-ca?cacert={}&connect_timeout=3",
        pki.dir.to_str().unwrap()
    );
    let (err, _) = connect_fails(&url);
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("cacert"), "{err}");
}

#[test]
fn tls_key_contents_never_appear_in_errors() {
    let pki = Pki::generate();
    let etcd = EtcdWith::start_tls(&pki);
    let (ca, crt, key) = (
        pki.path("ca.crt"),
        pki.path("client.crt"),
        pki.path("client.key"),
    );
    // Files in the wrong places: the key where certificates are expected, and a certificate
    // where the key is expected. Each must fail without echoing the key back.
    let cases = [
        format!("cacert={key}&cert={crt}&key={key}"),
        format!("cacert={ca}&cert={key}&key={crt}"),
        format!("cacert={ca}&cert={key}&key={key}"),
        format!("cacert={}&cert={crt}&key={key}", pki.path("other-ca.crt")),
    ];
    let mut messages = Vec::new();
    for query in &cases {
        let url = tls_url(&etcd, "key-leak", &format!("{query}&connect_timeout=3"));
        let (err, took) = connect_fails(&url);
        assert!(
            matches!(
                err.kind(),
                ErrorKind::Connection | ErrorKind::InvalidArgument
            ),
            "{query}: {:?}: {err}",
            err.kind()
        );
        assert!(took < FAIL_BOUND, "{query}: took {took:?}: {err}");
        assert_no_key_material(&pki, err.message());
        // A PEM file in the wrong option is named before any connection is tried.
        if query.contains(&format!("cert={key}")) || query.starts_with(&format!("cacert={key}")) {
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{query}: {err}");
        }
        messages.push(format!("{query} -> {:?}: {err}", err.kind()));
    }
    // The fragments checked are real: they do occur in the key file itself.
    let key_text: String = pki.read("client.key").lines().collect();
    assert!(key_fragments(&pki).iter().all(|f| key_text.contains(f)));
    eprintln!("{}", messages.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Authentication and per-run roles

const ROOT_PASSWORD: &str = "root-Secret-41c7";
const ALICE_PASSWORD: &str = "alice-Secret-9d2e";
const BOB_PASSWORD: &str = "bob-Secret-5a80";
const CAROL_PASSWORD: &str = "carol-Secret-77b1";

/// A plain etcd with auth enabled: `root`, `alice` (role `job-a`: read/write on
/// `/rdzv/job-a/`), `bob` (role `job-b`: read/write on `/rdzv/job-b/`) and `carol` (role
/// `watch-a`: read only on `/rdzv/job-a/`, as a dashboard or a scheduler's observer).
fn etcd_with_users() -> Etcd {
    let etcd = Etcd::start();
    let endpoint = etcd.endpoint();
    block_on(async move {
        let mut c = Client::connect([endpoint.as_str()], None).await.unwrap();
        c.user_add("root", ROOT_PASSWORD, None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        for (user, password, job) in [
            ("alice", ALICE_PASSWORD, "job-a"),
            ("bob", BOB_PASSWORD, "job-b"),
        ] {
            c.role_add(job).await.unwrap();
            c.role_grant_permission(
                job,
                Permission::read_write(format!("/rdzv/{job}/")).with_prefix(),
            )
            .await
            .unwrap();
            c.user_add(user, password, None).await.unwrap();
            c.user_grant_role(user, job).await.unwrap();
        }
        c.role_add("watch-a").await.unwrap();
        c.role_grant_permission("watch-a", Permission::read("/rdzv/job-a/").with_prefix())
            .await
            .unwrap();
        c.user_add("carol", CAROL_PASSWORD, None).await.unwrap();
        c.user_grant_role("carol", "watch-a").await.unwrap();
        c.auth_enable().await.unwrap();
    });
    etcd
}

async fn client_as(endpoint: &str, user: &str, password: &str) -> Client {
    let options = ConnectOptions::new().with_user(user, password);
    Client::connect([endpoint], Some(options)).await.unwrap()
}

fn is_permission_denied(result: Result<impl std::fmt::Debug, etcd_client::Error>) -> bool {
    match result {
        Err(etcd_client::Error::GRpcStatus(s)) => s.code() == tonic::Code::PermissionDenied,
        other => panic!("expected permission denied, got {other:?}"),
    }
}

#[test]
fn auth_user_forms_a_round_in_its_own_prefix() {
    let etcd = etcd_with_users();
    let url = format!(
        "etcd://{}/job-a?username=alice&password={ALICE_PASSWORD}&min_nodes=2&max_nodes=2&connect_timeout={OK_CONNECT}&join_timeout=20",
        etcd.endpoint()
    );
    two_nodes_share_a_store(&url);
    // Everything rdzv wrote is inside the run's prefix.
    let endpoint = etcd.endpoint();
    let outside = block_on(async move {
        let mut root = client_as(&endpoint, "root", ROOT_PASSWORD).await;
        let all = root
            .get("", Some(GetOptions::new().with_all_keys().with_keys_only()))
            .await
            .unwrap();
        all.kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_string())
            .filter(|k| !k.starts_with("/rdzv/job-a/"))
            .collect::<Vec<_>>()
    });
    assert!(outside.is_empty(), "keys outside the run: {outside:?}");
}

#[test]
fn auth_user_is_refused_outside_its_prefix() {
    let etcd = etcd_with_users();
    let url = format!(
        "etcd://{}/job-b?username=alice&password={ALICE_PASSWORD}&connect_timeout=3",
        etcd.endpoint()
    );
    let (err, took) = connect_fails(&url);
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(took < FAIL_BOUND, "took {took:?}: {err}");
    let m = err.message();
    assert!(m.contains("permission"), "{err}");
    assert!(
        m.contains("check username/password and role permissions"),
        "{err}"
    );
    assert!(m.contains(&etcd.endpoint()), "{err}");
    assert!(!m.contains(ALICE_PASSWORD), "password leaked: {err}");
}

#[test]
fn auth_wrong_password_is_a_connection_error_without_the_password() {
    let etcd = etcd_with_users();
    let wrong = "not-Alices-Pw-6b1f";
    let url = format!(
        "etcd://{}/job-a?username=alice&password={wrong}&connect_timeout=3",
        etcd.endpoint()
    );
    let (err, took) = connect_fails(&url);
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(took < FAIL_BOUND, "took {took:?}: {err}");
    assert!(!err.message().contains(wrong), "password leaked: {err}");
    assert!(!err.message().contains(ALICE_PASSWORD), "{err}");
    assert!(err.message().contains(&etcd.endpoint()), "{err}");
    assert!(
        err.message().contains("check username/password"),
        "the hint is missing: {err}"
    );
    eprintln!("wrong password -> {err}");

    // No credentials at all is refused too.
    let url = format!("etcd://{}/job-a?connect_timeout=3", etcd.endpoint());
    let (err, took) = connect_fails(&url);
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(took < FAIL_BOUND, "took {took:?}: {err}");
    eprintln!("no credentials -> {err}");
}

#[test]
fn auth_other_jobs_user_cannot_touch_this_run() {
    let etcd = etcd_with_users();
    // alice runs job-a; it stays running (handle alive) while bob tries to interfere.
    let url_a = format!(
        "etcd://{}/job-a?username=alice&password={ALICE_PASSWORD}&connect_timeout={OK_CONNECT}",
        etcd.endpoint()
    );
    let alice = BlockingRendezvous::new(Params::from_url(&url_a).unwrap()).unwrap();
    let (info, store) = alice.next().unwrap();
    assert_eq!(info.world_size, 1);
    store.set("model", b"alice's").unwrap();

    let endpoint = etcd.endpoint();
    let before = block_on({
        let endpoint = endpoint.clone();
        async move {
            let mut bob = client_as(&endpoint, "bob", BOB_PASSWORD).await;
            let prefix = GetOptions::new().with_prefix();
            assert!(is_permission_denied(
                bob.get("/rdzv/job-a/", Some(prefix.clone())).await
            ));
            assert!(is_permission_denied(
                bob.get("/rdzv/job-a/current", None).await
            ));
            assert!(is_permission_denied(
                bob.put("/rdzv/job-a/closed", "1", None).await
            ));
            assert!(is_permission_denied(
                bob.delete(
                    "/rdzv/job-a/",
                    Some(etcd_client::DeleteOptions::new().with_prefix())
                )
                .await
            ));
            // bob's credentials do work, inside his own prefix.
            bob.put("/rdzv/job-b/probe", "ok", None).await.unwrap();
            let mut root = client_as(&endpoint, "root", ROOT_PASSWORD).await;
            root.get("/rdzv/job-a/", Some(prefix))
                .await
                .unwrap()
                .count()
        }
    });
    assert!(before > 0, "alice's run must have keys");

    // bob's rdzv node cannot join alice's run.
    let url_b = format!(
        "etcd://{}/job-a?username=bob&password={BOB_PASSWORD}&connect_timeout=3",
        etcd.endpoint()
    );
    let (err, took) = connect_fails(&url_b);
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(took < FAIL_BOUND, "took {took:?}: {err}");
    assert!(err.message().contains("permission"), "{err}");

    // alice's run is untouched: not closed, nobody waiting, her value intact.
    assert!(!alice.is_closed().unwrap());
    assert_eq!(alice.num_waiting().unwrap(), 0);
    assert_eq!(
        store.get("model", Some(Duration::from_secs(5))).unwrap(),
        b"alice's"
    );
    alice.shutdown().unwrap();
}

#[test]
fn an_observer_needs_only_read_access_and_close_purge_drain_need_write_access() {
    let etcd = etcd_with_users();
    let run = |user: &str, password: &str| {
        format!(
            "etcd://{}/job-a?username={user}&password={password}&min_nodes=2&max_nodes=2&connect_timeout={OK_CONNECT}&join_timeout=20",
            etcd.endpoint()
        )
    };
    let alice = run("alice", ALICE_PASSWORD);
    let nodes = common::on_threads(2, move |_| {
        let node = BlockingRendezvous::new(Params::from_url(&alice).unwrap()).unwrap();
        node.next().map(|(info, _)| info).unwrap();
        node
    });
    let carol = rdzv::BlockingAdmin::new(Params::from_url(&run("carol", CAROL_PASSWORD)).unwrap())
        .expect("read access is enough to connect an observer");
    let status = carol.status().unwrap();
    assert_eq!(status.sealed.as_ref().unwrap().members.len(), 2);
    assert_eq!(carol.watch_next(Duration::from_secs(10)).unwrap(), status);
    let node = nodes[0].node_id().to_string();
    for (operation, result) in [
        ("close", carol.close()),
        ("purge", carol.purge(true).map(|_| ())),
        ("drain", carol.drain(&node, "")),
    ] {
        let err = result.expect_err(operation);
        assert_eq!(err.kind(), ErrorKind::Connection, "{operation}: {err}");
        assert!(
            err.message().contains("permission")
                && err.message().contains(&format!("refused {operation}")),
            "{operation}: {err}"
        );
        assert!(
            !err.message().contains(CAROL_PASSWORD),
            "password leaked: {err}"
        );
    }
    // Nothing was changed: the run is open, its keys are there, nobody drains.
    let after = carol.status().unwrap();
    assert!(!after.closed && after.exists && after.draining().is_empty());
}
