"""The library's log records arrive in Python's ``logging`` under the ``"rdzv"`` logger, with
their level, the module that made them and the run, node and round fields. RDZV_LOG is read
once per process, so each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import rdzv
from conftest import PKG_ROOT, dies_with_this_process
from rdzv import _log

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
                         capture_output=True, text=True, timeout=60,
                         preexec_fn=dies_with_this_process())
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


def test_records_reach_caplog_with_levels_and_fields(etcd, run_id, caplog):
    # conftest makes this process log at info.
    caplog.set_level(logging.INFO, logger="rdzv")
    url = f"etcd://{etcd.endpoint}/{run_id}?min_nodes=2&max_nodes=2&join_timeout=30"
    handlers = [rdzv.EtcdV3RendezvousHandler.from_url(url) for _ in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            infos = list(pool.map(lambda h: h.next_rendezvous(), handlers))
        for info in infos:
            info.store.close()
        nodes = {h.node_id for h in handlers}
    finally:
        for h in handlers:
            h.shutdown()
    ours = [r for r in caplog.records if r.name == "rdzv" and r.rdzv_fields.get("run") == run_id]

    def named(msg):
        return [r for r in ours if r.getMessage().startswith(msg)]

    complete = named("round complete")
    assert {r.rdzv_fields["node"] for r in complete} == nodes
    for r in complete:
        assert (r.levelno, r.rdzv_target) == (logging.INFO, "rdzv::rendezvous")
        assert r.rdzv_fields["round"] == 0 and r.rdzv_fields["world_size"] == 2
    joined = named("joined round")
    assert sorted(r.rdzv_fields["role"] for r in joined) == ["follower", "leader"]
    (sealed,) = named("round sealed")
    assert sealed.rdzv_fields["trigger"] == "max_nodes"
    assert isinstance(sealed.rdzv_fields["since_first_join_ms"], int)
    assert all(r.rdzv_fields["etcd_version"].startswith("3.") for r in named("connected to etcd"))
    # One node's records in the order it made them.
    for node in nodes:
        mine = [r.getMessage().split(" run=")[0] for r in ours if r.rdzv_fields["node"] == node]
        steps = [m for m in mine if m in ("connected to etcd", "joined round", "round complete", "shut down")]
        assert steps == ["connected to etcd", "joined round", "round complete", "shut down"], mine


def test_levels_are_mapped_and_quoted_values_parsed(caplog):
    caplog.set_level(logging.DEBUG, logger="rdzv")
    for level in (1, 2, 3, 4, 5):
        _log._forward(level, b"rdzv::test", f'level {level} what="store set" n=3'.encode(), None)
    got = [(r.levelno, r.rdzv_fields) for r in caplog.records if r.rdzv_target == "rdzv::test"]
    fields = {"what": "store set", "n": 3}
    assert got == [(logging.ERROR, fields), (logging.WARNING, fields), (logging.INFO, fields),
                   (logging.DEBUG, fields), (logging.DEBUG, fields)]
    assert _log.fields(r'e="a \"b\" c" x=') == {"e": 'a "b" c', "x": ""}


REENTRANT = """
import json, logging, sys
sys.path.insert(0, sys.argv[2])
import rdzv
url = sys.argv[1]
observer = rdzv.EtcdV3RendezvousHandler.from_url(url)
victim = rdzv.EtcdV3RendezvousHandler.from_url(url)
calls, errors, closed_inside = [], [], []
class CallsRdzv(logging.Handler):
    # Records arrive on library threads and on this thread inside rdzv calls: a blocking call
    # from here must work, and so must a close (as a finalizer run by the GC would make).
    def emit(self, record):
        try:
            calls.append(observer.is_closed())
            if not closed_inside and record.getMessage().startswith("round complete"):
                closed_inside.append(victim.node_id)
                victim.close()
        except Exception as e:
            errors.append(repr(e))
handler = CallsRdzv()
logging.getLogger("rdzv").addHandler(handler)
logging.getLogger("rdzv").setLevel(logging.INFO)
with rdzv.EtcdV3RendezvousHandler.from_url(url) as h:
    h.next_rendezvous().store.close()
logging.getLogger("rdzv").removeHandler(handler)
observer.close()
print(json.dumps({"calls": calls, "errors": errors, "closed": closed_inside}))
"""


def test_a_handler_may_call_rdzv_and_close_a_handle(etcd, run_id):
    url = f"etcd://{etcd.endpoint}/{run_id}?min_nodes=1"
    env = dict(os.environ, RDZV_LOG="info")
    out = subprocess.run([sys.executable, "-c", REENTRANT, url, str(PKG_ROOT)], env=env,
                         capture_output=True, text=True, timeout=60,
                         preexec_fn=dies_with_this_process())
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["errors"] == [], got["errors"][:3]
    assert got["calls"] and all(c is False for c in got["calls"]), got["calls"]
    assert len(got["closed"]) == 1
    # The close made inside the handler released the node: its alive key is gone at once,
    # not when its lease expires.
    assert etcd.keys(f"/rdzv/{run_id}/alive/{got['closed'][0]}") == []


def test_ids_that_look_like_numbers_stay_text():
    # A node id is 16 hex digits: now and then all of them are decimal ones.
    from rdzv._log import fields

    got = fields('round complete node=2982607029823126 run=42 keys=4 run_lease_id=7 msg="a b"')
    assert got == {"node": "2982607029823126", "run": "42", "keys": 4, "run_lease_id": "7",
                   "msg": "a b"}
