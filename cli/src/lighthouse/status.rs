//! The `/status` page (as torchft's Lighthouse serves on its gRPC port): the last quorum, the
//! heartbeats, and why the next quorum waits; on a lighthouse that does not lead, where the
//! leader is (its own page has the state).

use super::service::Lighthouse;
use axum::response::Html;
use std::fmt::Write;

pub fn router(lighthouse: Lighthouse) -> axum::Router {
    let for_metrics = lighthouse.clone();
    let page = move || {
        let lighthouse = lighthouse.clone();
        async move { Html(render(&lighthouse).await) }
    };
    let metrics = {
        let lighthouse = for_metrics;
        move || {
            let lighthouse = lighthouse.clone();
            async move {
                (
                    [("content-type", crate::prometheus::CONTENT_TYPE)],
                    metrics(&lighthouse).await,
                )
            }
        }
    };
    axum::Router::new()
        .route("/", axum::routing::get(page.clone()))
        .route("/status", axum::routing::get(page))
        .route("/metrics", axum::routing::get(metrics))
}

/// `/metrics`: the counters, with the gauges read from the state now.
async fn metrics(lighthouse: &Lighthouse) -> String {
    let m = &lighthouse.metrics;
    let leading = lighthouse.routing.borrow().leading.clone();
    m.leading.set(i64::from(leading.is_some()));
    if let Some(leader) = leading {
        let s = leader.snapshot().await;
        m.quorum_id.set(s.quorum_id);
        m.participants
            .set(s.last.as_ref().map_or(0, |q| q.participants.len() as i64));
        m.replica_groups.set(s.heartbeats.len() as i64);
    }
    m.render()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn render(lighthouse: &Lighthouse) -> String {
    let routing = lighthouse.routing.borrow().clone();
    let mut html =
        String::from("<!DOCTYPE html><html><head><title>rdzv lighthouse</title></head><body>");
    let _ = write!(html, "<h1>Lighthouse {}</h1>", escape(&lighthouse.me));
    let Some(leader) = routing.leading else {
        match routing.observed {
            Some(addr) => {
                let a = escape(&addr);
                let _ = write!(html, "<p>Role: follower (forwards to the leader, <a href=\"{a}/status\">{a}</a>)</p>");
            }
            None => html.push_str("<p>Role: follower (no leader elected yet)</p>"),
        }
        html.push_str("</body></html>");
        return html;
    };
    let s = leader.snapshot().await;
    html.push_str("<p>Role: leader</p>");
    let _ = write!(html, "<p>Quorum ID: {}</p>", s.quorum_id);
    let _ = write!(html, "<p>Quorum status: {}</p>", escape(&s.why));
    let _ = write!(html, "<p>Asking for the next quorum: {}</p>", s.asking);
    match &s.last {
        None => html.push_str("<h2>Previous quorum</h2><p>none</p>"),
        Some(q) => {
            let max_step = q.participants.iter().map(|p| p.step).max().unwrap_or(-1);
            let _ = write!(
                html,
                "<h2>Previous quorum</h2><p>Participants: {}, max step: {max_step}</p>\
                 <table border=\"1\"><tr><th>replica_id</th><th>address</th><th>store_address</th>\
                 <th>step</th><th>world_size</th><th>shrink_only</th><th>commit_failures</th></tr>",
                q.participants.len()
            );
            for p in &q.participants {
                let _ = write!(
                    html,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    escape(&p.replica_id),
                    escape(&p.address),
                    escape(&p.store_address),
                    p.step,
                    p.world_size,
                    p.shrink_only,
                    p.commit_failures
                );
            }
            html.push_str("</table>");
        }
    }
    html.push_str("<h2>Heartbeats</h2><table border=\"1\"><tr><th>replica_id</th><th>last heartbeat</th></tr>");
    for (id, age) in &s.heartbeats {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{:.3} s ago</td></tr>",
            escape(id),
            age.as_secs_f64()
        );
    }
    html.push_str("</table></body></html>");
    html
}
