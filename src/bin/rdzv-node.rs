//! `rdzv-node`: one rendezvous node as a process, for the demo, the multi-process tests and
//! the benchmark. Prints one JSON line per completed round on stdout and one JSON line for
//! an error, then exits (0 on success, 2 on a rendezvous error, 64 on bad usage).
//!
//! ```text
//! rdzv-node URL [--rounds N] [--follow] [--exchange] [--close]
//! ```
//! `--rounds N`  take part in N rounds in a row (default 1).
//! `--follow`    between rounds, stay in the round until another node waits or a member is
//!               lost (the way an elastic agent monitors its round), then call next again.
//! `--exchange`  in each round, publish this node's id under its rank and read every other
//!               rank's id from the round's store, reporting how many were read.
//! `--close`     close the run after the last round.

use rdzv::{BlockingRendezvous, Error, Params};
use serde_json::json;
use std::time::Duration;

struct Options {
    url: String,
    rounds: u32,
    follow: bool,
    exchange: bool,
    close: bool,
}

fn parse_args() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: rdzv-node URL [--rounds N] [--follow] [--exchange] [--close]")?;
    let mut o = Options {
        url,
        rounds: 1,
        follow: false,
        exchange: false,
        close: false,
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                o.rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--rounds: expected a whole number")?
            }
            "--follow" => o.follow = true,
            "--exchange" => o.exchange = true,
            "--close" => o.close = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(o)
}

fn error_line(e: &Error) -> String {
    json!({ "error": format!("{:?}", e.kind()), "message": e.message() }).to_string()
}

fn take_part(rdzv: &BlockingRendezvous, o: &Options) -> Result<(), Error> {
    for i in 0..o.rounds {
        let (info, store) = rdzv.next()?;
        let mut line = json!({
            "node": rdzv.node_id(),
            "pid": std::process::id(),
            "round": info.round,
            "rank": info.rank,
            "world_size": info.world_size,
            "master_addr": info.master_addr,
            "master_port": info.master_port,
        });
        if o.exchange {
            store.set(&format!("node/{}", info.rank), rdzv.node_id().as_bytes())?;
            let keys: Vec<String> = (0..info.world_size).map(|r| format!("node/{r}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let ids = store.multi_get(&refs, Some(Duration::from_secs(60)))?;
            let total = store.add("arrived", 1)?;
            line["peers_read"] = json!(ids.len());
            line["own_id_ok"] = json!(ids[info.rank as usize] == rdzv.node_id().as_bytes());
            line["add_result"] = json!(total);
        }
        println!("{line}");
        if o.follow && i + 1 < o.rounds {
            // An elastic agent's monitor loop: stay until the round needs to change.
            loop {
                let (waiting, lost) = (rdzv.num_waiting()?, rdzv.num_lost()?);
                if waiting > 0 || lost > 0 {
                    println!(
                        "{}",
                        json!({ "event": "change", "waiting": waiting, "lost": lost })
                    );
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    if o.close {
        rdzv.set_closed()?;
    }
    rdzv.shutdown()
}

fn main() {
    // Records to stderr, filtered by RDZV_LOG (warnings only by default).
    rdzv::log::install_default();
    let options = match parse_args() {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(64);
        }
    };
    let fail = |e: Error| -> ! {
        println!("{}", error_line(&e));
        std::process::exit(2);
    };
    let params = Params::from_url(&options.url).unwrap_or_else(|e| fail(e));
    let rdzv = BlockingRendezvous::new(params).unwrap_or_else(|e| fail(e));
    // Report a failure before shutting down: shutdown may take up to close_timeout when etcd
    // is unreachable, and whoever reads this output should not wait for that.
    if let Err(e) = take_part(&rdzv, &options) {
        println!("{}", error_line(&e));
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let _ = rdzv.shutdown();
        std::process::exit(2);
    }
}
