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
        paused_for: None,
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
fn a_paused_worker_is_not_watched_and_an_unlearned_section_is_no_hang_under_auto() {
    let given = MonitorConfig {
        hang: Some(Timeout::Given(secs(5.0))),
        ..MonitorConfig::default()
    };
    let mut paused = page(Some(60.0), None);
    paused.paused_for = Some(secs(59.0));
    assert_eq!(
        monitor(&given).limit(Some(&paused), secs(99.0), &Learned::default()),
        None
    );
    // Under auto, a section that never ended has no timeout of its own, and the heartbeat's
    // learned one does not apply inside it: only an initial timeout does, when given.
    let learned = Learned {
        beat: Some(secs(0.1)),
        ..Learned::default()
    };
    let first_save = page(Some(30.0), Some(("checkpoint", 30.0)));
    let auto = MonitorConfig {
        hang: Some(Timeout::Auto),
        ..MonitorConfig::default()
    };
    assert_eq!(
        monitor(&auto).limit(Some(&first_save), secs(40.0), &learned),
        None
    );
    let auto_initial = MonitorConfig {
        hang: Some(Timeout::Auto),
        initial: Some(secs(600.0)),
        ..MonitorConfig::default()
    };
    assert_eq!(
        monitor(&auto_initial).limit(Some(&first_save), secs(40.0), &learned),
        Some((secs(30.0), secs(600.0), "--hang-initial-timeout"))
    );
    // An explicit `NAME=auto` beside a given heartbeat timeout: the same.
    let section_auto = MonitorConfig {
        hang: Some(Timeout::Given(secs(5.0))),
        sections: vec![("checkpoint".into(), Timeout::Auto)],
        ..MonitorConfig::default()
    };
    assert_eq!(
        monitor(&section_auto).limit(Some(&first_save), secs(40.0), &learned),
        None
    );
    // A learned value too large to multiply saturates instead of overflowing.
    let huge = Learned {
        beat: Some(Duration::MAX / 2),
        ..Learned::default()
    };
    let (_, t, _) = monitor(&auto)
        .limit(Some(&page(Some(1.0), None)), secs(2.0), &huge)
        .unwrap();
    assert_eq!(t, Duration::MAX);
}
