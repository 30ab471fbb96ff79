"""Scale-out: 2 barata serve replicas behind nginx on loopback
(scripts/serve-replicas.sh with deploy/nginx.conf). The load test through
nginx loses nothing, and both replicas served requests (their /metrics)."""
import os
import signal
import subprocess
import time

import loadgen
from common import ROOT, SMOLLM2, barata, check, free_port_run, need_model, read_metrics, wait_healthy

need_model()
env = dict(os.environ, BARATA=barata())


def start():
    """serve-replicas.sh on a fresh run of 3 ports; (proc, port, lines)."""
    port = free_port_run(3)
    proc = subprocess.Popen(
        [os.path.join(ROOT, "scripts", "serve-replicas.sh"), "2", str(port), "-m", SMOLLM2, "-t", "1",
         "--slots", "4", "--max-queue", "24"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    t0 = time.time()
    while time.time() - t0 < 120:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        print(line.rstrip())
        if "nginx on http" in line:
            break
    return proc, port, lines


# Another process can still take one of the ports between the check and the
# replicas' bind; that (and only that) is retried on a new run of ports.
for attempt in range(3):
    proc, port, lines = start()
    if any("nginx on http" in l for l in lines) or not any("port is in use" in l for l in lines):
        break
    proc.wait(timeout=60)
    print(f"test_scaleout: a port was taken meanwhile; again ({attempt + 1})")
try:
    check(any("nginx on http" in l for l in lines), "2 replicas and nginx are up")
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    summary, problems = loadgen.run(url, n_requests=200, concurrency=32, seed=5)
    check(not problems, f"through nginx: no problem in {summary['requests']} requests")
    served = []
    for i in (1, 2):
        m = read_metrics(f"http://127.0.0.1:{port + i}")
        served.append(m["barata_requests_finished_total"])
        check(m["barata_slots_in_use"] == 0 and m["barata_kv_blocks_used"] == 0,
              f"replica {i}: nothing in use after the run")
    check(all(n > 0 for n in served), f"both replicas served requests: {served}")
    finished = sum(served)
    check(finished >= summary["completed"], f"replicas finished {finished:.0f} >= {summary['completed']} completed")
finally:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
print("test_scaleout: all passed")
