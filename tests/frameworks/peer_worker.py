"""A worker that depends on its peers the way a gloo or NCCL process group does, without torch.

Every rank keeps one TCP connection to rank 0 (MASTER_ADDR:MASTER_PORT). The first step is a
message from rank 0 to every rank and an answer back; then the ranks hold their connections.
When a peer's process dies, its connection breaks and the others fail at once (exit 1), as
trainers fail on a collective with a dead peer. The worker ends with exit 0 once the file named
by PEER_WORKER_DONE exists (checked every 50 ms; a connection that breaks after that is the
other ranks ending too), or after PEER_WORKER_LIFETIME seconds (default 600).

For the launcher benchmark's failed case, one of them fails after the first step:

- the worker whose environment has PEER_WORKER_STAMP writes the wall-clock time (time.time(),
  the last thing it does) to that file and exits 7;
- the others, with PEER_WORKER_PEERS=break (the default, gloo's way), exit 1 as soon as a
  connection breaks; with PEER_WORKER_PEERS=hold they never look at their connections again, as
  ranks blocked in a collective that waits for a dead peer until its timeout (NCCL's way): only
  their launcher can end them.

Lines on stdout, for the tests and the launcher benchmark:
  STARTED world=W rank=R restart=C pid=P   as soon as the process runs
  STEP world=W rank=R restart=C pid=P      after the first step with every peer
"""

import os
import select
import socket
import sys
import time

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
addr = os.environ["MASTER_ADDR"]
port = int(os.environ["MASTER_PORT"])
# torchrun's c10d agent hosts its own store at MASTER_PORT (rdzv run and the etcd-v3 backend
# leave it to the workers): take the next port then.
if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
    port += 1
done = os.environ.get("PEER_WORKER_DONE")
lifetime = float(os.environ.get("PEER_WORKER_LIFETIME", "600"))
stamp = os.environ.get("PEER_WORKER_STAMP")
hold = os.environ.get("PEER_WORKER_PEERS", "break") == "hold"
ends = time.monotonic() + lifetime
tag = f"world={world} rank={rank} restart={restart} pid={os.getpid()}"


def say(what):
    print(f"{what} {tag}", flush=True)


def finished():
    return (done is not None and os.path.exists(done)) or time.monotonic() > ends


def lost(why):
    if finished():
        sys.exit(0)
    print(f"PEER LOST {tag}: {why}", file=sys.stderr, flush=True)
    sys.exit(1)


def read_line(sock):
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(64)
        if not chunk:
            lost("connection closed during the first step")
        data += chunk
    return data.strip()


say("STARTED")
peers = []
try:
    if rank == 0:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(world)
        server.settimeout(120)
        for _ in range(world - 1):
            peer = server.accept()[0]
            read_line(peer)  # its rank
            peers.append(peer)
        for p in peers:
            p.sendall(b"step\n")
        for p in peers:
            if read_line(p) != b"ok":
                lost("unexpected answer")
    else:
        deadline = time.monotonic() + 120
        while True:
            try:
                s = socket.create_connection((addr, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    lost("rank 0 never listened")
                time.sleep(0.05)  # rank 0 is starting: connect again
        s.sendall(f"{rank}\n".encode())
        if read_line(s) != b"step":
            lost("unexpected message")
        s.sendall(b"ok\n")
        peers.append(s)
except OSError as e:
    lost(e)
say("STEP")

if stamp is not None:
    sys.stdout.flush()
    with open(stamp + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.rename(stamp + ".tmp", stamp)  # whole files only
    os._exit(7)

while not finished():
    if hold:
        time.sleep(0.05)  # blocked in a collective: nothing to read, only the end to notice
        continue
    readable, _, _ = select.select(peers, [], [], 0.05)
    for p in readable:
        try:
            data = p.recv(64)
        except OSError as e:
            lost(e)
        if not data:
            lost("a peer's connection closed")
sys.exit(0)
