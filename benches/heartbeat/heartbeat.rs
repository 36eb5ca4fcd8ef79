//! heartbeat.c's measurement in Rust, through the library's own API (`rdzv::progress`, no C
//! ABI); same arguments and output.

use std::time::Instant;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .expect("usage: bench_heartbeat REPS CALLS SECTION_CALLS")
        })
        .collect();
    let [reps, calls, section_calls] = args[..] else {
        eprintln!("usage: bench_heartbeat REPS CALLS SECTION_CALLS");
        std::process::exit(2);
    };
    rdzv::progress::heartbeat();
    print!(
        "monitored {}\nheartbeat",
        rdzv::progress::is_monitored() as u8
    );
    for _ in 0..reps {
        let start = Instant::now();
        for _ in 0..calls {
            rdzv::progress::heartbeat();
        }
        print!(" {:.3}", start.elapsed().as_nanos() as f64 / calls as f64);
    }
    print!("\nstep");
    for _ in 0..reps {
        let start = Instant::now();
        for i in 0..calls {
            rdzv::progress::heartbeat_step(i as i64).expect("heartbeat with a step");
        }
        print!(" {:.3}", start.elapsed().as_nanos() as f64 / calls as f64);
    }
    print!("\nsection");
    for _ in 0..reps {
        let start = Instant::now();
        for _ in 0..section_calls {
            rdzv::progress::section_begin("step").expect("section begin");
            rdzv::progress::section_end("step").expect("section end");
        }
        print!(
            " {:.3}",
            start.elapsed().as_nanos() as f64 / section_calls as f64
        );
    }
    println!();
}
