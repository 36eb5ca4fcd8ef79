//! A TCP proxy in front of etcd that holds every answer back for a fixed delay: etcd slowed by
//! load as its clients see it (every answer late, the connection alive), which neither a
//! frozen etcd (no answer at all) nor a dead one (a broken connection) shows.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

pub struct SlowProxy {
    pub port: u16,
    stopped: Arc<AtomicBool>,
    /// Both ends of every connection, shut down when the proxy is dropped.
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl SlowProxy {
    /// Listens on a free port; what etcd at `target_port` sends reaches the client `delay`
    /// after etcd sent it (requests go through at once).
    pub fn start(target_port: u16, delay: Duration) -> SlowProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stopped = Arc::new(AtomicBool::new(false));
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let (stop, keep) = (stopped.clone(), sockets.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(etcd) = TcpStream::connect(("127.0.0.1", target_port)) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), etcd.set_nodelay(true));
                keep.lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), etcd.try_clone().unwrap()]);
                let (to_etcd, from_client) =
                    (etcd.try_clone().unwrap(), client.try_clone().unwrap());
                std::thread::spawn(move || copy(from_client, to_etcd, Duration::ZERO));
                std::thread::spawn(move || copy(etcd, client, delay));
            }
        });
        SlowProxy {
            port,
            stopped,
            sockets,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read, in order; then ends
/// `to`'s writing side.
fn copy(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (chunks, delayed) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        for (due, chunk) in delayed {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if chunks
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(chunks);
    let _ = writer.join();
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for socket in self.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}
