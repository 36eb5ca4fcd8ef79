use super::*;
use crate::error::ErrorKind;

fn invalid(result: Result<Params>) -> String {
    let err = result.expect_err("expected an invalid-argument error");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    err.message().to_string()
}

#[test]
fn url_with_cluster_and_options() {
    let p = Params::from_url(
        "etcd://10.0.0.1:2379,10.0.0.2:2380/job-42?min_nodes=2&max_nodes=8&last_call_timeout=5&timeout=12.5",
    )
    .unwrap();
    assert_eq!(p.endpoints, ["10.0.0.1:2379", "10.0.0.2:2380"]);
    assert_eq!(p.run_id, "job-42");
    assert_eq!((p.min_nodes, p.max_nodes), (2, 8));
    assert_eq!(p.last_call_timeout, Duration::from_secs(5));
    assert_eq!(p.join_timeout, Duration::from_millis(12500));
    assert!(!p.security.https);
    let tls = Params::from_url("etcds://h/j?nnodes=1:4&etcd_prefix=/x&min_workers=2").unwrap();
    assert!(tls.security.https);
    assert_eq!(tls.endpoints, ["h:2379"]);
    assert_eq!(
        (tls.min_nodes, tls.max_nodes, tls.key_prefix.as_str()),
        (2, 4, "/x")
    );
    let escaped = Params::from_url("etcd://h:1/a%2Fb%20c?min_nodes=1").unwrap();
    assert_eq!(escaped.run_id, "a/b c");
}

#[test]
fn every_error_names_what_was_wrong() {
    assert!(invalid(Params::from_url("http://h:1/j")).contains("scheme"));
    assert!(invalid(Params::from_url("etcd://h:1")).contains("run id"));
    assert!(invalid(Params::from_url("etcd://h:1/")).contains("run_id"));
    assert!(invalid(Params::from_url("etcd://h:99999/j")).contains("port"));
    assert!(invalid(Params::from_url("etcd://h:1/j?min_nodes=0")).contains("min_nodes"));
    assert!(
        invalid(Params::from_url("etcd://h:1/j?min_nodes=3&max_nodes=2")).contains("max_nodes")
    );
    assert!(invalid(Params::from_url("etcd://h:1/j?min_nodes=-1")).contains("whole number"));
    assert!(invalid(Params::from_url("etcd://h:1/j?min_nodes=1x")).contains("min_nodes"));
    assert!(invalid(Params::from_url("etcd://h:1/j?join_timeout=5s")).contains("join_timeout"));
    assert!(invalid(Params::from_url("etcd://h:1/j?lease_ttl=1")).contains("lease_ttl"));
    assert!(invalid(Params::from_url("etcd://h:1/j?protocol=ftp")).contains("protocol"));
    assert!(invalid(Params::from_url("etcd://u:p@h:1/j")).contains("credentials"));
    assert!(invalid(Params::from_url("etcd://h:1/j?cacert=/ca.pem")).contains("https"));
    assert!(invalid(Params::from_url("etcd://h:1/j?bad%zz=1")).contains("escape"));
    let unknown = invalid(Params::from_url("etcd://h:1/j?colour=red"));
    assert!(
        unknown.contains("colour") && unknown.contains("last_call_timeout"),
        "{unknown}"
    );
    assert!(invalid(Params::new("etcd-v2", "h:1", "j", 1, 1)).contains("backend"));
    assert!(invalid(Params::new("etcd-v3", "", "j", 1, 1)).contains("endpoint"));
}

#[test]
fn a_failed_set_changes_nothing() {
    let mut p = Params::new("etcd-v3", "h:1", "j", 2, 4).unwrap();
    let before = p.clone();
    assert!(p.set("max_nodes", "1").is_err());
    assert!(p.set("nope", "1").is_err());
    assert_eq!(p, before);
    p.set("local_addr", "10.0.0.9").unwrap();
    assert_eq!(p.advertised_addr(), "10.0.0.9");
}

#[test]
fn debug_output_hides_secrets() {
    let p = Params::from_url("etcd://h:1/j?username=alice&password=hunter2").unwrap();
    let shown = format!("{p:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("alice"),
        "{shown}"
    );
}

/// A small property test: URLs spliced from valid and hostile fragments never panic, and every
/// failure is an invalid-argument error with a message.
#[test]
fn spliced_urls_never_panic() {
    const PIECES: &[&str] = &[
        "etcd://",
        "etcds://",
        "http://",
        "h",
        ":",
        "2379",
        "99999",
        ",",
        "/",
        "job",
        "%",
        "%2F",
        "%zz",
        "?",
        "&",
        "=",
        "min_nodes",
        "max_nodes",
        "nnodes",
        "1",
        "0",
        ":",
        "-1",
        "4294967296",
        "last_call_timeout",
        "0.5",
        "1e9",
        ".",
        "protocol",
        "https",
        "cacert",
        "[::1]",
        "@",
        "+",
        "\u{0}",
        "é",
        " ",
        "join_timeout",
        "99999999999",
        "key_prefix",
        "x",
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..50_000 {
        let len = (next() % 16) as usize;
        let url: String = (0..len)
            .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
            .collect();
        if let Err(e) = Params::from_url(&url) {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url:?}: {e}");
            assert!(!e.message().is_empty());
        }
    }
}

#[test]
fn absurd_numbers_are_rejected_not_panicked_on() {
    let huge = "9".repeat(40);
    assert!(invalid(Params::from_url(&format!(
        "etcd://h:1/j?join_timeout={huge}"
    )))
    .contains("join_timeout"));
    assert!(
        invalid(Params::from_url(&format!("etcd://h:1/j?min_nodes={huge}"))).contains("min_nodes")
    );
    assert!(invalid(Params::from_url("etcd://h:1/j?join_timeout=1..2")).contains("join_timeout"));
}

#[test]
fn max_nodes_follows_min_nodes_until_given() {
    let only_min = Params::from_url("etcd://h:1/j?min_nodes=3").unwrap();
    assert_eq!((only_min.min_nodes, only_min.max_nodes), (3, 3));
    let max_first = Params::from_url("etcd://h:1/j?max_nodes=8&min_nodes=3").unwrap();
    assert_eq!((max_first.min_nodes, max_first.max_nodes), (3, 8));
    let mut explicit = Params::from_url("etcd://h:1/j").unwrap();
    explicit.set("min_workers", "2").unwrap();
    assert_eq!(explicit.max_nodes, 2);
    explicit.set("max_nodes", "5").unwrap();
    explicit.set("min_nodes", "4").unwrap();
    assert_eq!(
        (explicit.min_nodes, explicit.max_nodes),
        (4, 5),
        "a given max stays"
    );
    assert!(
        invalid(Params::from_url("etcd://h:1/j?max_nodes=2&min_nodes=3")).contains("max_nodes")
    );
}

#[test]
fn input_that_would_be_cut_or_misread_is_refused_by_name() {
    // An address longer than a host name can be is refused, not cut.
    let mut p = Params::from_url("etcd://h:1/j").unwrap();
    let long = "a".repeat(MAX_ADDR_BYTES + 1);
    let err = p.set("local_addr", &long).unwrap_err().to_string();
    assert!(
        err.contains("local_addr: expected at most 253 bytes"),
        "{err}"
    );
    assert_eq!(p.local_addr(), None, "the refused value is not kept");
    p.set("local_addr", &"a".repeat(MAX_ADDR_BYTES)).unwrap();
    // A NUL in the run id or the key prefix (C would read them cut short).
    assert!(invalid(Params::from_url("etcd://h:1/j%00x")).contains("run_id: expected no NUL"));
    assert!(invalid(Params::from_url("etcd://h:1/j?key_prefix=/a%00b"))
        .contains("key_prefix: expected no NUL"));
    // A TLS scheme and protocol=http disagree; plain scheme and protocol=https is TLS.
    assert!(invalid(Params::from_url("etcds://h:1/j?protocol=http")).contains("means TLS"));
    assert!(Params::from_url("etcd://h:1/j?protocol=https").is_ok());
}

#[test]
fn errors_show_a_bad_value_cut_short_with_its_length() {
    let huge = "x".repeat(1 << 20);
    let err = invalid(Params::from_url(&format!("etcd://h:1/j?min_nodes={huge}")));
    assert!(err.len() < 300, "{} bytes", err.len());
    assert!(err.contains("(1048576 bytes)"), "{err}");
    // An empty entry at the end of a 70 000-entry list: the list is not repeated whole.
    let endpoints = vec!["h:1"; 70_000].join(",") + ",";
    let err = invalid(Params::new("etcd-v3", &endpoints, "j", 1, 1));
    assert!(err.len() < 300, "{} bytes", err.len());
    assert_eq!(shown("short"), "\"short\"");
}

#[test]
fn an_endpoint_without_a_port_means_etcds_2379_in_both_forms() {
    let url = Params::from_url("etcd://h/j").unwrap();
    let new = Params::new("etcd-v3", "h", "j", 1, 1).unwrap();
    assert_eq!(url.endpoints, ["h:2379"]);
    assert_eq!(new.endpoints, url.endpoints);
    // An empty port is refused in both, by the same words.
    let a = invalid(Params::from_url("etcd://h:/j"));
    let b = invalid(Params::new("etcd-v3", "h:", "j", 1, 1));
    assert_eq!(a, b);
}
