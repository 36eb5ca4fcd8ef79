use super::reader::Reader;
use super::writer::{beat, begin, end, Page};
use super::*;

fn page() -> (std::path::PathBuf, Page, Reader) {
    let dir = std::env::temp_dir().join(format!(
        "rdzv-progress-{}-{}",
        std::process::id(),
        monotonic_ns()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("progress");
    create_page(&path).unwrap();
    let reader = Reader::open(&path).unwrap();
    assert_eq!(reader.snapshot(), None, "a page nobody mapped says nothing");
    let page = Page::open(&path).unwrap();
    (dir, page, reader)
}

#[test]
fn heartbeats_are_counted_and_their_longest_interval_learned_after_the_warmup() {
    let (dir, page, reader) = page();
    let first = reader.snapshot().unwrap();
    assert_eq!(first.pid, std::process::id());
    assert_eq!((first.beats, first.since_beat, first.step), (0, None, None));
    for _ in 0..WARMUP_BEATS {
        beat(&page, None);
    }
    assert_eq!(
        reader.snapshot().unwrap().max_interval,
        None,
        "warm-up not counted"
    );
    std::thread::sleep(std::time::Duration::from_millis(30));
    beat(&page, Some(41));
    let s = reader.snapshot().unwrap();
    assert_eq!((s.beats, s.step), (WARMUP_BEATS + 1, Some(41)));
    let longest = s.max_interval.expect("an interval after the warm-up");
    assert!(
        longest >= std::time::Duration::from_millis(30),
        "{longest:?}"
    );
    assert!(s.since_beat.unwrap() < longest);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn nested_sections_show_the_innermost_and_record_durations() {
    let (dir, page, reader) = page();
    begin(&page, "step").unwrap();
    begin(&page, "allreduce").unwrap();
    let open = reader.snapshot().unwrap().open.unwrap();
    assert_eq!((open.name.as_str(), open.depth), ("allreduce", 2));
    end(&page, "allreduce").unwrap();
    let open = reader.snapshot().unwrap().open.unwrap();
    assert_eq!((open.name.as_str(), open.depth), ("step", 1));
    let err = end(&page, "checkpoint").unwrap_err();
    assert!(err.to_string().contains("\"checkpoint\""), "{err}");
    end(&page, "step").unwrap();
    begin(&page, "step").unwrap();
    end(&page, "step").unwrap();
    let s = reader.snapshot().unwrap();
    assert_eq!(s.open, None);
    let counts: Vec<(&str, u64)> = s
        .sections
        .iter()
        .map(|r| (r.name.as_str(), r.count))
        .collect();
    assert_eq!(counts, [("allreduce", 1), ("step", 2)]);
    assert!(s.sections[1].total >= s.sections[1].max);
    assert!(s.since_event.is_some());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_reader_never_sees_half_a_section_name() {
    let (dir, page, reader) = page();
    let names = ["a", "a_much_longer_section_name_of_39_bytes!"];
    assert_eq!(names[1].len(), MAX_SECTION_NAME);
    let writer = std::thread::spawn(move || {
        for i in 0..20_000 {
            let name = names[i % 2];
            begin(&page, name).unwrap();
            end(&page, name).unwrap();
        }
    });
    let mut seen = 0;
    while !writer.is_finished() {
        if let Some(open) = reader.snapshot().and_then(|s| s.open) {
            assert!(names.contains(&open.name.as_str()), "{:?}", open.name);
            seen += 1;
        }
    }
    writer.join().unwrap();
    assert!(
        seen > 0 || cfg!(miri),
        "the reader never saw a section open"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn names_are_checked_even_outside_a_launcher() {
    for bad in ["", "x\0y", &"n".repeat(MAX_SECTION_NAME + 1)] {
        let err = section_begin(bad).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().starts_with("section name:"), "{err}");
    }
    assert!(heartbeat_step(-1).is_err());
    assert!(set_stack_signal(65).is_err());
}
