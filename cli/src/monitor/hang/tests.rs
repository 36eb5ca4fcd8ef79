use super::*;
use rdzv::progress::{Section, SectionStats};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn page(silent: Option<f64>, open: Option<(&str, f64)>) -> Snapshot {
    Snapshot {
        pid: 1,
        beats: 10,
        step: None,
        since_beat: silent.map(secs),
        since_event: silent.map(secs),
        max_interval: Some(secs(0.1)),
        open: open.map(|(n, t)| Section {
            name: n.into(),
            open_for: secs(t),
            depth: 1,
        }),
        stack_signal: 0,
        sections: vec![SectionStats {
            name: "ckpt".into(),
            count: 1,
            max: secs(3.0),
            total: secs(3.0),
        }],
    }
}

fn monitor(cfg: &MonitorConfig) -> HangMonitor<'_> {
    HangMonitor {
        cfg,
        carried: Box::leak(Box::new(Learned::default())),
        interval: secs(0.1),
        store: None,
    }
}

#[test]
fn a_given_timeout_counts_from_the_last_progress_and_a_sections_own_replaces_it() {
    let cfg = MonitorConfig {
        hang: Some(Timeout::Given(secs(5.0))),
        sections: vec![("ckpt".into(), Timeout::Given(secs(60.0)))],
        ..MonitorConfig::default()
    };
    let m = monitor(&cfg);
    let job = Learned::default();
    assert_eq!(
        m.limit(None, secs(99.0), &job),
        None,
        "not watched before its first call"
    );
    assert_eq!(
        m.limit(Some(&page(None, None)), secs(99.0), &job),
        None,
        "nor before its first progress"
    );
    assert_eq!(
        m.limit(Some(&page(Some(2.0), None)), secs(9.0), &job),
        Some((secs(2.0), secs(5.0), "--hang-timeout"))
    );
    // In a section with its own timeout: the section's; in another: the heartbeat's.
    assert_eq!(
        m.limit(
            Some(&page(Some(30.0), Some(("ckpt", 30.0)))),
            secs(40.0),
            &job
        ),
        Some((secs(30.0), secs(60.0), "--section-timeout"))
    );
    assert_eq!(
        m.limit(
            Some(&page(Some(6.0), Some(("step", 6.0)))),
            secs(40.0),
            &job
        ),
        Some((secs(6.0), secs(5.0), "--hang-timeout"))
    );
}

#[test]
fn auto_applies_five_times_the_longest_interval_with_a_floor_and_an_initial_timeout() {
    let cfg = MonitorConfig {
        hang: Some(Timeout::Auto),
        initial: Some(secs(120.0)),
        ..MonitorConfig::default()
    };
    let m = monitor(&cfg);
    let none = Learned::default();
    assert_eq!(
        m.limit(None, secs(3.0), &none),
        Some((secs(3.0), secs(120.0), "--hang-initial-timeout"))
    );
    assert_eq!(
        m.limit(Some(&page(Some(1.0), None)), secs(3.0), &none),
        Some((secs(1.0), secs(120.0), "--hang-initial-timeout"))
    );
    let slow = Learned {
        beat: Some(secs(2.0)),
        ..Learned::default()
    };
    assert_eq!(
        m.limit(Some(&page(Some(1.0), None)), secs(3.0), &slow),
        Some((secs(1.0), secs(10.0), "learned"))
    );
    let fast = Learned {
        beat: Some(secs(0.01)),
        ..Learned::default()
    };
    assert_eq!(
        m.limit(Some(&page(Some(1.0), None)), secs(3.0), &fast),
        Some((secs(1.0), AUTO_FLOOR, "learned"))
    );
    // A section learned under auto gets its own timeout.
    let ckpt = Learned {
        beat: Some(secs(0.01)),
        sections: [("ckpt".to_string(), secs(3.0))].into(),
    };
    assert_eq!(
        m.limit(
            Some(&page(Some(8.0), Some(("ckpt", 8.0)))),
            secs(9.0),
            &ckpt
        ),
        Some((secs(8.0), secs(15.0), "learned"))
    );
}

#[test]
fn learned_values_merge_to_the_longest_and_smooth_to_the_mean_across_attempts() {
    let a = Learned {
        beat: Some(secs(1.0)),
        sections: [("x".to_string(), secs(4.0))].into(),
    };
    let b = Learned {
        beat: Some(secs(3.0)),
        sections: [("y".to_string(), secs(2.0))].into(),
    };
    let mut m = a.clone();
    m.merge(&b);
    assert_eq!(m.beat, Some(secs(3.0)));
    assert_eq!(m.sections.len(), 2);
    let s = a.smoothed(&b);
    assert_eq!(s.beat, Some(secs(2.0)));
    assert_eq!(s.sections.get("x"), Some(&secs(4.0)));
    assert_eq!(Learned::from_json(&m.to_json()), m);
    assert!(m.grew_from(&a) && !m.grew_from(&m));
}

#[test]
fn the_rank_that_stopped_first_is_the_suspect_and_the_rest_wait_on_it() {
    let w = |rank: u64, at: Option<u64>, section: Option<&str>| json!({"rank": rank, "local_rank": rank % 2, "host": "h", "last_progress_ms": at, "section": section, "silent_s": 9.0});
    let all = [
        w(0, Some(1_000_400), Some("allreduce")),
        w(1, Some(1_000_500), Some("allreduce")),
        w(3, Some(1_000_000), Some("step")),
        w(2, Some(1_000_450), Some("allreduce")),
        w(4, None, None),
        json!({"rank": 5, "ended": true, "last_progress_ms": 1, "host": "h"}),
    ];
    let v = verdict(&all).unwrap();
    assert_eq!(v.suspect["rank"], 3);
    assert_eq!(
        v.victims.len(),
        3,
        "a rank that never reported, or ended, is left out"
    );
    let lines = v.lines();
    assert!(
        lines[0]
            .starts_with("suspect: rank 3 (local rank 1 on h) stopped first, in section \"step\""),
        "{lines:?}"
    );
    assert_eq!(
        lines[1],
        "waiting on it: rank(s) 0-2 in section \"allreduce\", stopped up to 0.5 s later"
    );
    assert_eq!(verdict(&[]), None);
    // Heartbeats alone: every rank's last one in the same step, none in a section.
    let alike = [
        w(0, Some(2_000_010), None),
        w(1, Some(2_000_000), None),
        w(2, Some(2_000_900), None),
    ];
    let lines = verdict(&alike).unwrap().lines();
    assert!(
        lines[0].contains("(uncertain: rank(s) 0 stopped within 0.1 s of it"),
        "{lines:?}"
    );
    assert_eq!(compress(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
}
