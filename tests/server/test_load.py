"""Load on loopback: 200 requests from 32 concurrent clients against
barata serve (4 slots, a queue of 24), streaming and not, one stream in ten
hung up after its first event. Every accepted request completes well formed
and equal to the same request alone (greedy); every refusal is a 429 with
Retry-After; afterwards no slot, block or queue place is still held."""
import json
import os
import time

import loadgen
from common import Server, check

out_dir = os.environ.get("BARATA_TEST_OUT", ".")
with Server("--slots", "4", "--max-queue", "24", "-t", "2") as s:
    summary, problems = loadgen.run(s.url, n_requests=200, concurrency=32, seed=3)
    check(not problems, f"no problem in {summary['requests']} requests")
    check(summary["completed"] > 0 and summary["rejected_429"] >= 0,
          f"{summary['completed']} completed, {summary['rejected_429']} got 429, "
          f"{summary['hung_up']} hung up")
    # Hung-up streams are cancelled within a step or so; give them a moment.
    for _ in range(100):
        m = s.metrics()
        if m["barata_slots_in_use"] == 0 and m["barata_queue_depth"] == 0:
            break
        time.sleep(0.05)
    check(m["barata_slots_in_use"] == 0, "no slot in use after the run")
    check(m["barata_kv_blocks_used"] == 0, "no KV block in use after the run")
    check(m["barata_queue_depth"] == 0, "nothing queued after the run")
    check(m["barata_requests_rejected_total"] == summary["rejected_429"], "/metrics counts the 429s")
    check(m["barata_requests_cancelled_total"] <= summary["hung_up"],
          f"cancelled {m['barata_requests_cancelled_total']:.0f} <= hung up {summary['hung_up']}")
    with open(os.path.join(out_dir, "load.json"), "w") as f:
        json.dump(summary, f, indent=1)
    rc = s.stop()
    check(rc == 0, "the server exits 0 on SIGTERM")
print("test_load: all passed")
