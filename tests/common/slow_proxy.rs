//! A TCP proxy in front of etcd that holds every answer back for a fixed delay: etcd slowed by
//! load as its clients see it (every answer late, the connection alive), which neither a
//! frozen etcd (no answer at all) nor a dead one (a broken connection) shows. And one that
//! loses etcd's answer to one request after etcd acted on it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

pub struct SlowProxy {
    pub port: u16,
    /// Whether `lose_answer_to`'s cut happened.
    cut: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
    /// Both ends of every connection, shut down when the proxy is dropped.
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl SlowProxy {
    /// Listens on a free port; what etcd at `target_port` sends reaches the client `delay`
    /// after etcd sent it (requests go through at once).
    pub fn start(target_port: u16, delay: Duration) -> SlowProxy {
        let cut = Arc::new(AtomicBool::new(false));
        SlowProxy::serve(target_port, cut, move |client, etcd| {
            let (to_etcd, from_client) = (etcd.try_clone().unwrap(), client.try_clone().unwrap());
            std::thread::spawn(move || copy(from_client, to_etcd, Duration::ZERO));
            std::thread::spawn(move || copy(etcd, client, delay));
        })
    }

    /// Loses etcd's answer to the first request whose gRPC message contains `pattern`: once
    /// etcd answered it (so it took effect), the client's connection is cut before the answer
    /// reaches it, as when the member fails right after applying a write. Frames are
    /// forwarded whole; `answer_lost` says whether it happened.
    pub fn lose_answer_to(target_port: u16, pattern: Vec<u8>) -> SlowProxy {
        let pattern = Arc::new(pattern);
        let cut = Arc::new(AtomicBool::new(false));
        let cutting = cut.clone();
        SlowProxy::serve(target_port, cut, move |client, etcd| {
            let (to_etcd, from_client) = (etcd.try_clone().unwrap(), client.try_clone().unwrap());
            // The request's stream on this connection (stream ids are per connection).
            let stream = Arc::new(Mutex::new(None::<u32>));
            let (found, pattern) = (stream.clone(), pattern.clone());
            std::thread::spawn(move || {
                forward_frames(from_client, to_etcd, true, |id, kind, payload| {
                    let mut found = found.lock().unwrap();
                    // A DATA frame carries the message.
                    if found.is_none()
                        && kind == 0
                        && payload.windows(pattern.len()).any(|w| w == &pattern[..])
                    {
                        *found = Some(id);
                    }
                    true
                })
            });
            let cutting = cutting.clone();
            std::thread::spawn(move || {
                forward_frames(etcd, client, false, |id, kind, _| {
                    // HEADERS or DATA of the answer, the first time: cut instead of
                    // forwarding it (false), once.
                    let answer = *stream.lock().unwrap() == Some(id) && kind <= 1;
                    !answer || cutting.swap(true, Ordering::SeqCst)
                })
            });
        })
    }

    /// Holds back the first request whose gRPC message contains `pattern`, once `arm`ed: the
    /// frame that carries it, and everything after it on that connection, wait until
    /// `release`, as the network buffers a write of a process paused (SIGSTOP) just after it
    /// sent it. `holding` says when it has one; `answer` is etcd's answer to it once it came.
    pub fn hold(target_port: u16, pattern: Vec<u8>) -> (SlowProxy, Hold) {
        let hold = Hold::default();
        let proxy = {
            let hold = hold.clone();
            SlowProxy::serve(
                target_port,
                Arc::new(AtomicBool::new(false)),
                move |client, etcd| {
                    let (to_etcd, from_client) =
                        (etcd.try_clone().unwrap(), client.try_clone().unwrap());
                    let (asking, answering, pattern) =
                        (hold.clone(), hold.clone(), pattern.clone());
                    std::thread::spawn(move || {
                        forward_frames(from_client, to_etcd, true, |id, kind, payload| {
                            let mut s = asking.0.state.lock().unwrap();
                            if s.armed
                                && s.stream.is_none()
                                && kind == 0
                                && payload.windows(pattern.len()).any(|w| w == &pattern[..])
                            {
                                s.stream = Some(id);
                                asking.0.changed.notify_all();
                                while !s.released {
                                    s = asking.0.changed.wait(s).unwrap();
                                }
                            }
                            true
                        })
                    });
                    std::thread::spawn(move || {
                        forward_frames(etcd, client, false, |id, kind, payload| {
                            let mut s = answering.0.state.lock().unwrap();
                            if kind == 0 && s.stream == Some(id) && s.answer.is_none() {
                                s.answer = Some(payload.to_vec());
                                answering.0.changed.notify_all();
                            }
                            true
                        })
                    });
                },
            )
        };
        (proxy, hold)
    }

    /// How protobuf encodes the start of an etcd `Compare` on `key` with `target` (1: its
    /// creation revision, 2: its modification revision), for `lose_answer_to`'s pattern: the
    /// guard that singles out one kind of request.
    pub fn compare_on(target: u8, key: &str) -> Vec<u8> {
        let mut pattern = vec![0x10, target, 0x1a, key.len() as u8];
        pattern.extend_from_slice(key.as_bytes());
        pattern
    }

    /// Whether `lose_answer_to`'s request was answered by etcd and the answer lost.
    pub fn answer_lost(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Accepts clients on a free port and gives each, with its own connection to etcd at
    /// `target_port`, to `connect`; `cut` is what `answer_lost` reads.
    fn serve(
        target_port: u16,
        cut: Arc<AtomicBool>,
        connect: impl Fn(TcpStream, TcpStream) + Send + 'static,
    ) -> SlowProxy {
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
                connect(client, etcd);
            }
        });
        SlowProxy {
            port,
            cut,
            stopped,
            sockets,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// `SlowProxy::hold`'s request: armed, seen (its stream), released, answered.
#[derive(Clone, Default)]
pub struct Hold(Arc<Shared>);

#[derive(Default)]
struct Shared {
    state: Mutex<Held>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct Held {
    armed: bool,
    stream: Option<u32>,
    released: bool,
    answer: Option<Vec<u8>>,
}

impl Hold {
    /// Holds the next request that matches, from now on.
    pub fn arm(&self) {
        self.0.state.lock().unwrap().armed = true;
    }

    /// Waits up to `within` for a request to be held; whether one is.
    pub fn holding(&self, within: Duration) -> bool {
        let s = self.0.state.lock().unwrap();
        let (s, _) = self
            .0
            .changed
            .wait_timeout_while(s, within, |s| s.stream.is_none())
            .unwrap();
        s.stream.is_some()
    }

    /// Lets the held request (and what followed it) go on to etcd.
    pub fn release(&self) {
        self.0.state.lock().unwrap().released = true;
        self.0.changed.notify_all();
    }

    /// etcd's answer to the held request (its DATA frame's payload: the gRPC message with its
    /// 5-byte prefix), waited for up to `within`.
    pub fn answer(&self, within: Duration) -> Option<Vec<u8>> {
        let s = self.0.state.lock().unwrap();
        let (s, _) = self
            .0
            .changed
            .wait_timeout_while(s, within, |s| s.answer.is_none())
            .unwrap();
        s.answer.clone()
    }
}

/// Forwards HTTP/2 frames from `from` to `to` whole (after the client's connection preface,
/// when `preface`), each first shown to `keep` (stream id, frame type, payload): on false,
/// both connections are cut there.
fn forward_frames(
    mut from: TcpStream,
    mut to: TcpStream,
    preface: bool,
    mut keep: impl FnMut(u32, u8, &[u8]) -> bool,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut skip = if preface { 24 } else { 0 };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        let mut whole = 0;
        if skip > 0 {
            whole = skip.min(pending.len());
            skip -= whole;
        }
        // Frame header: 24-bit length, type, flags, 31-bit stream id.
        while skip == 0 && pending.len() >= whole + 9 {
            let h = &pending[whole..whole + 9];
            let length = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
            let (kind, id) = (
                h[3],
                u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
            );
            if pending.len() < whole + 9 + length {
                break;
            }
            if !keep(id, kind, &pending[whole + 9..whole + 9 + length]) {
                let _ = to.write_all(&pending[..whole]);
                let _ = (from.shutdown(Shutdown::Both), to.shutdown(Shutdown::Both));
                return;
            }
            whole += 9 + length;
        }
        if to.write_all(&pending[..whole]).is_err() {
            break;
        }
        pending.drain(..whole);
    }
    let _ = to.shutdown(Shutdown::Write);
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
