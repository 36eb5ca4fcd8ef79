//! The fault schedule: an endless sequence of episodes drawn from a seed, so that the same
//! seed replays the same faults in the same order with the same timing (the run takes as
//! much of it as fits in its duration). An episode is one fault, or several at once on
//! different targets; the next episode starts a random gap after the last one healed, most
//! often late enough for the job to recover first, sometimes while it is still recovering.

use super::history::FaultKind;
use std::time::Duration;

/// xorshift64: small, seeded, the same sequence everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // A zero state would stay zero; mixing keeps nearby seeds apart.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in [lo, hi).
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = (hi - lo).as_millis() as u64;
        lo + Duration::from_millis(self.below(span.max(1)))
    }
}

/// One fault of an episode, relative to the episode's start.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub kind: FaultKind,
    /// Node slot, or etcd member.
    pub target: usize,
    pub offset: Duration,
    pub hold: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// Wait after the previous episode healed (after the job first formed, for the first).
    pub gap: Duration,
    pub faults: Vec<Planned>,
}

/// What the schedule may do.
pub struct Shape {
    pub nodes: usize,
    pub etcd_members: usize,
    /// False where network namespaces cannot be made: no partitions then.
    pub partitions: bool,
    pub lease_ttl: Duration,
}

/// The schedule of `seed`: an endless iterator of episodes.
pub fn episodes(seed: u64, shape: Shape) -> impl Iterator<Item = Episode> {
    let mut rng = Rng::new(seed);
    let kinds: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|&k| shape.partitions || k != FaultKind::Partition)
        .collect();
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    std::iter::repeat_with(move || {
        // Mostly long enough to recover first (lease TTL + last call and some), sometimes not.
        let gap = match rng.below(10) {
            0..=6 => rng.between(shape.lease_ttl + s(3), shape.lease_ttl + s(6)),
            _ => rng.between(ms(200), s(2)),
        };
        let count = match rng.below(10) {
            0..=6 => 1,
            7..=8 => 2,
            _ => 3,
        };
        let mut faults: Vec<Planned> = Vec::new();
        while faults.len() < count {
            let kind = kinds[rng.below(kinds.len() as u64) as usize];
            let (targets, hold) = match kind {
                FaultKind::Kill => (shape.nodes, rng.between(ms(500), s(4))),
                FaultKind::Pause | FaultKind::Partition => (
                    shape.nodes,
                    rng.between(shape.lease_ttl + s(1), shape.lease_ttl + s(3)),
                ),
                FaultKind::EtcdKill => (shape.etcd_members, rng.between(ms(500), s(4))),
            };
            let target = rng.below(targets as u64) as usize;
            // One fault per target, and one etcd member down at a time (the cluster keeps its
            // quorum; losing it is a different experiment).
            let node_fault = |k: FaultKind| k != FaultKind::EtcdKill;
            let clash = faults.iter().any(|f| {
                (f.kind == FaultKind::EtcdKill && kind == FaultKind::EtcdKill)
                    || (node_fault(f.kind) && node_fault(kind) && f.target == target)
            });
            if clash {
                continue;
            }
            let offset = match faults.is_empty() {
                true => Duration::ZERO,
                false => rng.between(Duration::ZERO, ms(1500)),
            };
            faults.push(Planned {
                kind,
                target,
                offset,
                hold,
            });
        }
        Episode { gap, faults }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(partitions: bool) -> Shape {
        Shape {
            nodes: 8,
            etcd_members: 3,
            partitions,
            lease_ttl: Duration::from_secs(3),
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let a: Vec<Episode> = episodes(42, shape(true)).take(50).collect();
        let b: Vec<Episode> = episodes(42, shape(true)).take(50).collect();
        let c: Vec<Episode> = episodes(43, shape(true)).take(50).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn every_kind_comes_up_and_targets_never_clash() {
        let plan: Vec<Episode> = episodes(7, shape(true)).take(300).collect();
        for kind in FaultKind::ALL {
            assert!(
                plan.iter().flat_map(|e| &e.faults).any(|f| f.kind == kind),
                "{kind:?}"
            );
        }
        assert!(
            plan.iter().any(|e| e.faults.len() > 1),
            "no episode with several faults"
        );
        for e in &plan {
            let etcd = e
                .faults
                .iter()
                .filter(|f| f.kind == FaultKind::EtcdKill)
                .count();
            assert!(etcd <= 1, "{e:?}");
            let mut slots: Vec<usize> = e
                .faults
                .iter()
                .filter(|f| f.kind != FaultKind::EtcdKill)
                .map(|f| f.target)
                .collect();
            let n = slots.len();
            slots.dedup();
            slots.sort();
            slots.dedup();
            assert_eq!(slots.len(), n, "{e:?}");
            for f in &e.faults {
                if matches!(f.kind, FaultKind::Pause | FaultKind::Partition) {
                    assert!(
                        f.hold > Duration::from_secs(3),
                        "held past the lease: {f:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn without_namespaces_there_are_no_partitions() {
        let plan: Vec<Episode> = episodes(7, shape(false)).take(300).collect();
        assert!(plan
            .iter()
            .flat_map(|e| &e.faults)
            .all(|f| f.kind != FaultKind::Partition));
    }
}
