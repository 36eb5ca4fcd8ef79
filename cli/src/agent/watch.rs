//! What can end a running round from beside its group: the membership, another node's
//! failure, the hang and health monitors and the pace meter, whichever resolves first.

use super::source::{Round, Source};
use super::Event;
use crate::monitor::hang::{self, HangMonitor};
use crate::monitor::health;
use crate::monitor::pace::Meter;
use crate::monitor::pages::Watched;
use crate::monitor::respond::Place;

/// What can end a running round from outside its group, whichever comes first: the
/// membership check (members lost, nodes waiting, the run closed, this node drained) and
/// another node's failure verdict. Hang and health monitoring joins here (module comment), and
/// the report of this node's first step for the incident records, which never ends a round.
pub(super) async fn watch<S: Source>(
    source: &S,
    round: &Round,
    hangs: &HangMonitor<'_>,
    workers: &[Watched],
    health: Option<&crate::settings::monitor::HealthCheck>,
    incidents: impl std::future::Future<Output = Event>,
) -> Event {
    let peer_hung = async {
        match source.shared(round) {
            Some(store) if hangs.cfg.watches_progress() => hang::peer_hung(store).await,
            _ => std::future::pending().await,
        }
    };
    let unhealthy = async {
        match health {
            Some(hc) => health::watch(hc).await,
            None => std::future::pending().await,
        }
    };
    let pace = async {
        let Some(period) = hangs.cfg.pace else {
            return std::future::pending().await;
        };
        let mut meter = Meter::new();
        let key = format!("pace/{}", source.who());
        loop {
            if let Some(note) = meter.sample(workers) {
                source.note(&key, &note).await;
            }
            tokio::time::sleep(period).await;
        }
    };
    tokio::select! {
        stop = source.membership_change(true) => Event::Stop(stop),
        stop = source.peer_failed(round) => Event::Stop(stop),
        hung = hangs.watch(workers) => Event::Hung(hung),
        what = peer_hung => Event::PeerHung(what),
        why = unhealthy => Event::Unhealthy(why),
        never = pace => never,
        never = incidents => never,
    }
}

/// Where this node stands in the round, for the hang protocol.
pub(super) fn place<'a, S: Source>(source: &'a S, round: &Round, host: &'a str) -> Place<'a> {
    Place {
        store: source.shared(round),
        round: round.number,
        group_rank: round.group_rank,
        nodes: round.group_world_size,
        host,
    }
}
