//! The progress page's layout: byte offsets of 8-byte words (native endianness: the page
//! never leaves its machine). Version 1. A reader refuses a page whose magic or version it
//! does not know.
//!
//! ```text
//!   0  magic "RDZVPRG1"           written last when the worker maps the page
//!   8  version u32, pid u32
//!  16  beats                      heartbeats so far
//!  24  last_beat_ns               when the last heartbeat was
//!  32  step + 1                   the last step a heartbeat gave (0: none given)
//!  40  max_interval_ns            longest interval between heartbeats after WARMUP_BEATS
//!  48  last_event_ns              last heartbeat, section begin or section end
//!  56  stack_signal               the signal the worker dumps its stacks on (0: none)
//!  64  open_seq                   even: the open-section fields below are consistent
//!  72  open_depth                 sections open (nested)
//!  80  open_started_ns            when the innermost open section began
//!  88  open_name[48]              its name, NUL-padded
//! 136  paused_ns                  when the worker paused monitoring (0: not paused); the next
//!                                 heartbeat or section clears it
//! 144  reserved up to 192
//! 192  sections[16] x 64 bytes:   name[40], count u64, max_ns u64, total_ns u64
//! ```

pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"RDZVPRG1");
pub(crate) const VERSION: u32 = 1;

pub(crate) const MAGIC_AT: usize = 0;
pub(crate) const VERSION_PID_AT: usize = 8;
pub(crate) const BEATS_AT: usize = 16;
pub(crate) const LAST_BEAT_AT: usize = 24;
pub(crate) const STEP_AT: usize = 32;
pub(crate) const MAX_INTERVAL_AT: usize = 40;
pub(crate) const LAST_EVENT_AT: usize = 48;
pub(crate) const STACK_SIGNAL_AT: usize = 56;
pub(crate) const OPEN_SEQ_AT: usize = 64;
pub(crate) const OPEN_DEPTH_AT: usize = 72;
pub(crate) const OPEN_STARTED_AT: usize = 80;
pub(crate) const OPEN_NAME_AT: usize = 88;
pub(crate) const NAME_BYTES: usize = 48;
pub(crate) const PAUSED_AT: usize = 136;

pub(crate) const SECTIONS_AT: usize = 192;
pub(crate) const SECTIONS: usize = 16;
pub(crate) const SECTION_BYTES: usize = 64;
pub(crate) const SECTION_NAME_BYTES: usize = 40;
pub(crate) const SECTION_COUNT_OFF: usize = 40;
pub(crate) const SECTION_MAX_OFF: usize = 48;
pub(crate) const SECTION_TOTAL_OFF: usize = 56;

pub(crate) const PAGE_BYTES: usize = SECTIONS_AT + SECTIONS * SECTION_BYTES;

const _: () = assert!(OPEN_NAME_AT + NAME_BYTES <= PAUSED_AT);
const _: () = assert!(PAUSED_AT + 8 <= SECTIONS_AT);
const _: () = assert!(PAGE_BYTES <= 4096);

use std::sync::atomic::AtomicU64;

/// A shared mapping of a progress page. Every access is an atomic 8-byte word, so the worker
/// and the launcher may touch the page at the same time.
pub struct Mapping {
    base: *mut u8,
}

// SAFETY: the mapping is only ever accessed through atomics (`word`).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the page at `path` for writing, which must be at least `PAGE_BYTES` long (the
    /// launcher made it so). Only the worker maps its page: the launcher reads it with `pread`
    /// (`reader`), so that nothing the worker does to the file (truncating it, say) can fault
    /// the launcher.
    pub fn open(path: &std::path::Path) -> std::io::Result<Mapping> {
        use std::os::unix::io::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let len = file.metadata()?.len();
        if len < PAGE_BYTES as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: {len} bytes, a progress page has {PAGE_BYTES}",
                    path.display()
                ),
            ));
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh shared mapping of an open file of at least PAGE_BYTES; the file
        // descriptor may close afterwards (the mapping keeps the file).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_BYTES,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { base: base.cast() })
    }

    /// The 8-byte word at `offset` (a multiple of 8 below `PAGE_BYTES`).
    pub fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= PAGE_BYTES);
        // SAFETY: in bounds and aligned (mmap returns page-aligned memory); the mapping lives
        // as long as `self`, and shared memory is only ever accessed atomically.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `open` mapped.
        unsafe { libc::munmap(self.base.cast(), PAGE_BYTES) };
    }
}

/// Writes `name` NUL-padded into `bytes` bytes at `offset`, a word at a time.
pub fn store_name(page: &Mapping, offset: usize, bytes: usize, name: &str) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut padded = [0u8; NAME_BYTES];
    padded[..name.len()].copy_from_slice(name.as_bytes());
    for i in (0..bytes).step_by(8) {
        let word = u64::from_ne_bytes(padded[i..i + 8].try_into().expect("8 bytes"));
        page.word(offset + i).store(word, Relaxed);
    }
}

/// Reads a NUL-padded name of `bytes` bytes at `offset`.
pub fn load_name(page: &Mapping, offset: usize, bytes: usize) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut raw = Vec::with_capacity(bytes);
    for i in (0..bytes).step_by(8) {
        raw.extend_from_slice(&page.word(offset + i).load(Relaxed).to_ne_bytes());
    }
    name_of(&raw)
}

/// A NUL-padded name (invalid UTF-8 shown with replacement characters).
pub fn name_of(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}
