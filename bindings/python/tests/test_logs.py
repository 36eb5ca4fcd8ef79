"""The library's log records arrive in Python's ``logging`` under the ``"rdzv"`` logger, with
their level, the module that made them and the run, node and round fields. RDZV_LOG is read
once per process, so each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import PKG_ROOT

SCRIPT = """
import json, logging, sys
sys.path.insert(0, sys.argv[2])
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append({"level": record.levelname, "msg": record.getMessage(),
                        "target": getattr(record, "rdzv_target", None), "logger": record.name})
logging.getLogger("rdzv").addHandler(Keep())
logging.getLogger("rdzv").setLevel(logging.DEBUG)
import rdzv
with rdzv.EtcdV3RendezvousHandler.from_url(sys.argv[1]) as h:
    info = h.next_rendezvous()
    info.store.close()
    node = h.node_id
print(json.dumps({"node": node, "records": records}))
"""


def run_node(url: str, rdzv_log: str | None):
    env = dict(os.environ)
    env.pop("RDZV_LOG", None)
    if rdzv_log:
        env["RDZV_LOG"] = rdzv_log
    out = subprocess.run([sys.executable, "-c", SCRIPT, url, str(PKG_ROOT)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_records_reach_the_rdzv_logger_with_their_fields(etcd, run_id):
    url = f"etcd://{etcd.endpoint}/{run_id}?min_nodes=1"
    got = run_node(url, "info")
    complete = [r for r in got["records"] if r["msg"].startswith("round complete")]
    assert len(complete) == 1, got["records"]
    r = complete[0]
    assert (r["level"], r["logger"], r["target"]) == ("INFO", "rdzv", "rdzv::rendezvous")
    assert f"run={run_id}" in r["msg"] and f"node={got['node']}" in r["msg"]
    assert " round=0 " in r["msg"] and " world_size=1 " in r["msg"]
    assert any(r["msg"].startswith("connected to etcd") for r in got["records"])


def test_silent_by_default_apart_from_warnings(etcd, run_id):
    url = f"etcd://{etcd.endpoint}/{run_id}?min_nodes=1"
    got = run_node(url, None)
    assert [r for r in got["records"] if r["level"] not in ("WARNING", "ERROR")] == []
