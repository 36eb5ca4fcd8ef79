use super::reader::Reader;
use super::writer::{beat, begin, end, pause_page, Page};
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
            // Open for a few microseconds: long enough for two copies of the page to agree
            // now and then, short enough that most copies overlap a write.
            for _ in 0..500 {
                std::hint::spin_loop();
            }
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

#[test]
fn a_pause_is_shown_until_the_next_heartbeat_or_section() {
    let (dir, page, reader) = page();
    beat(&page, None);
    assert_eq!(reader.snapshot().unwrap().paused_for, None);
    pause_page(&page);
    assert!(reader.snapshot().unwrap().paused_for.is_some());
    beat(&page, None);
    assert_eq!(
        reader.snapshot().unwrap().paused_for,
        None,
        "a heartbeat resumes"
    );
    pause_page(&page);
    begin(&page, "final_save").unwrap();
    assert_eq!(
        reader.snapshot().unwrap().paused_for,
        None,
        "a section resumes"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Writes `bytes` at `offset` of the page file, as a worker scribbling on its page would.
fn scribble(path: &std::path::Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_at(bytes, offset).unwrap();
}

#[test]
fn a_truncated_or_unlinked_page_is_read_without_faulting_the_reader() {
    let (dir, page, reader) = page();
    let path = dir.join("progress");
    beat(&page, None);
    // Unlinked: the reader's file is still the worker's page.
    std::fs::remove_file(&path).unwrap();
    beat(&page, None);
    assert_eq!(reader.snapshot().unwrap().beats, 2);
    // Truncated under the reader (a mapped reader would die of SIGBUS here).
    let (dir2, page2, reader2) = self::page();
    beat(&page2, None);
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir2.join("progress"))
        .unwrap()
        .set_len(0)
        .unwrap();
    match reader2.read() {
        Read::Damaged(why) => assert!(why.contains("is 0 bytes"), "{why}"),
        other => panic!("a truncated page read as {other:?}"),
    }
    drop(page);
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_dir_all(dir2).unwrap();
}

#[test]
fn a_page_holding_what_no_worker_writes_is_damaged_with_the_reason() {
    let cases: [(&str, u64, Vec<u8>); 5] = [
        (
            "random bytes",
            0,
            (0..1216u32)
                .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
                .collect(),
        ),
        ("0xFF from byte 8", 8, vec![0xFF; 1208]),
        (
            "a far-future heartbeat",
            24,
            u64::MAX.to_ne_bytes().to_vec(),
        ),
        (
            "a far-future event",
            48,
            (u64::MAX / 2).to_ne_bytes().to_vec(),
        ),
        ("a zeroed magic", 0, vec![0; 8]),
    ];
    for (what, offset, bytes) in cases {
        let (dir, page, reader) = page();
        beat(&page, None);
        scribble(&dir.join("progress"), offset, &bytes);
        match reader.read() {
            Read::Damaged(why) => assert!(!why.is_empty(), "{what}"),
            other => panic!("{what}: read as {other:?}"),
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
    // A longest interval longer than the clock has run is refused too (a timeout learned from
    // it would overflow).
    let (dir, page, reader) = page();
    beat(&page, None);
    scribble(&dir.join("progress"), 40, &(u64::MAX - 1).to_ne_bytes());
    match reader.read() {
        Read::Damaged(why) => assert!(why.contains("longest heartbeat interval"), "{why}"),
        other => panic!("read as {other:?}"),
    }
    std::fs::remove_dir_all(dir).unwrap();
}
