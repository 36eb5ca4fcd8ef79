//! A leader that dies between two answers of one quorum. A leader hands a quorum to every
//! member at once, but the answers leave one by one; a follower that forwarded both calls got
//! one answer and then a broken connection for the other. The new leader knows nothing of that
//! quorum (its members did not change, so it is not in etcd): asked again, it would put the
//! unanswered member in a quorum of its own while the answered one trains in the old one. The
//! leader here is scripted in the test (it wins the election on etcd as a lighthouse does) so
//! that it dies exactly there, every time.

use crate::common::Etcd;
use crate::harness::{ids, Lighthouse, Replica};
use crate::proto::lighthouse_service_server::{LighthouseService, LighthouseServiceServer};
use crate::proto::{
    LighthouseHeartbeatRequest, LighthouseHeartbeatResponse, LighthouseQuorumRequest,
    LighthouseQuorumResponse, Quorum,
};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// Answers the first member of its quorum, then fails the other's call once `a_answered`.
struct DyingLeader {
    asked: Mutex<Vec<crate::proto::QuorumMember>>,
    both_asked: watch::Sender<bool>,
    a_answered: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl LighthouseService for DyingLeader {
    async fn quorum(
        &self,
        request: Request<LighthouseQuorumRequest>,
    ) -> Result<Response<LighthouseQuorumResponse>, Status> {
        let member = request.into_inner().requester.expect("a requester");
        {
            let mut asked = self.asked.lock().unwrap();
            asked.push(member.clone());
            if asked.len() == 2 {
                self.both_asked.send_replace(true);
            }
        }
        let _ = self.both_asked.subscribe().wait_for(|b| *b).await;
        if member.replica_id == "b" {
            let _ = self.a_answered.clone().wait_for(|a| *a).await;
            return Err(Status::unavailable("the leader died before this answer"));
        }
        let mut participants = self.asked.lock().unwrap().clone();
        participants.sort_by(|x, y| x.replica_id.cmp(&y.replica_id));
        Ok(Response::new(LighthouseQuorumResponse {
            quorum: Some(Quorum {
                quorum_id: 7,
                participants,
                created: None,
            }),
        }))
    }

    async fn heartbeat(
        &self,
        _: Request<LighthouseHeartbeatRequest>,
    ) -> Result<Response<LighthouseHeartbeatResponse>, Status> {
        Ok(Response::new(LighthouseHeartbeatResponse {}))
    }
}

#[test]
fn a_member_whose_answer_died_with_the_leader_gets_the_quorum_the_others_got() {
    let etcd = Etcd::start();
    let job = format!("lighthouse-torn-{}", std::process::id());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for the scripted leader");
        let address = format!("http://{}", listener.local_addr().unwrap());
        let (a_done, a_answered) = watch::channel(false);
        let leader = DyingLeader {
            asked: Mutex::default(),
            both_asked: watch::Sender::new(false),
            a_answered,
        };
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(LighthouseServiceServer::new(leader))
                .serve_with_incoming(incoming),
        );
        let params =
            rdzv::Params::from_url(&format!("etcd://{}/{job}?lease_ttl=2", etcd.endpoint()))
                .expect("the run's parameters");
        let election = rdzv::election::Election::connect(&params, "lighthouse")
            .await
            .expect("the lighthouse election");
        let leadership = election.campaign(&address).await.expect("leading");

        let follower = tokio::task::block_in_place(|| Lighthouse::start(&etcd.endpoint(), &job));
        let a = Replica::start("a", &follower.address).await;
        let b = Replica::start("b", &follower.address).await;
        let asks_a = tokio::spawn(a.quorum(1, Duration::from_secs(10)));
        let asks_b = tokio::spawn(b.quorum(1, Duration::from_secs(10)));
        let got_a = asks_a.await.unwrap().expect("a's quorum");
        a_done.send_replace(true);
        // The leader is gone: its lease revoked, as a follower that finds its address refusing
        // connections revokes it.
        leadership.resign().await.expect("resigning");
        server.abort();
        let got_b = asks_b
            .await
            .unwrap()
            .expect("b's quorum, though its answer died with the leader");
        assert_eq!(ids(&got_a), ["a", "b"]);
        assert_eq!(
            (got_b.quorum_id, ids(&got_b)),
            (got_a.quorum_id, ids(&got_a)),
            "b must train in the quorum a was given"
        );
        drop(follower);
    });
}
