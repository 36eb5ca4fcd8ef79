#!/usr/bin/env python3
"""A rendezvous node in Python: joins one round, publishes "python" under its rank in the
round's store, reads every rank's value, prints one JSON line and leaves.

    python3 bindings/python/examples/node.py 'etcd://127.0.0.1:2379/demo?min_nodes=2&max_nodes=4'

Output: {"lang":"python","rank":R,"world_size":N,"round":K,"peers":["c","python",...]}
On failure: {"lang":"python","error":"RDZV_ERR_...","during":"...","message":"..."}, exit 2.
"""

import json
import sys
from pathlib import Path

# Run from a checkout without installing: the package is next to this folder.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rdzv import EtcdV3RendezvousHandler, RendezvousError  # noqa: E402

LANG = "python"
GET_TIMEOUT = 60.0  # seconds to wait for the peers' values


def fail(during: str, error: BaseException) -> int:
    name = getattr(error, "status_name", type(error).__name__)
    print(json.dumps({"lang": LANG, "error": name, "during": during, "message": str(error)},
                     separators=(",", ":")),
          flush=True)
    return 2


def main(argv: list) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} etcd://HOST:PORT/RUN_ID?min_nodes=N&max_nodes=M", file=sys.stderr)
        return 64
    during = "new"
    try:
        with EtcdV3RendezvousHandler.from_url(argv[1]) as node:
            during = "next"
            info = node.next_rendezvous()
            with info.store as store:
                during = "set"
                store.set(f"node/{info.rank}", LANG)
                during = "multi_get"
                keys = [f"node/{r}" for r in range(info.world_size)]
                peers = store.multi_get(keys, timeout=GET_TIMEOUT)
            during = "shutdown"
            if not node.shutdown():
                raise RendezvousError("shutdown failed")
    except (RendezvousError, OSError) as e:
        return fail(during, e)
    print(json.dumps({
        "lang": LANG,
        "rank": info.rank,
        "world_size": info.world_size,
        "round": info.round,
        "peers": [p.decode("utf-8", "replace") for p in peers],
    }, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
