//! The figures the benchmarks print: a percentile by nearest rank (the median is the one at
//! 0.5, the upper middle one of an even count) and a duration in milliseconds.

use std::time::Duration;

/// The value at `p` (0 to 1) of `sorted`, by nearest rank; zero when there is none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The median of `v`; zero when there is none.
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    percentile(&v, 0.5)
}

/// The median, a `None` (never happened) counting as longer than any time.
pub fn median_or_none(mut v: Vec<Option<Duration>>) -> Option<Duration> {
    v.sort_by_key(|d| d.unwrap_or(Duration::MAX));
    v[v.len() / 2]
}

/// `d` in milliseconds with `places` decimals, without the unit (for a table's columns).
pub fn millis(d: Duration, places: usize) -> String {
    format!("{:.*}", places, d.as_secs_f64() * 1e3)
}

/// `d` in milliseconds with `places` decimals and the unit: "12.34 ms".
pub fn ms(d: Duration, places: usize) -> String {
    format!("{} ms", millis(d, places))
}
