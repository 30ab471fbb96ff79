"""Soak: a few thousand mixed requests (greedy, sampled, streamed, hung up
mid-stream, refused with 429 in bursts, malformed) against barata serve on the
committed tiny model, with the server's resident memory sampled as they go.
After a warm-up, memory must stay flat (the bound is printed and asserted),
and afterwards every gauge is back to 0. Before the fix, each sampled request
left its sampler and sequence behind (about 0.4 MB per request on SmolLM2)."""
import concurrent.futures as cf
import json
import os
import random
import socket
import time

import loadgen
from common import ROOT, Server, check

MODEL = os.path.join(ROOT, "tests", "data", "models", "stories260K.gguf")
N = int(os.environ.get("BARATA_SOAK_REQUESTS", "3000"))
WARMUP = N // 5
BOUND_MB = 3.0


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one(url, port, rng):
    kind = rng.choice(["greedy", "sampled", "stream", "hang_up", "chat", "bad"])
    body = {"prompt": "Once upon a time", "max_tokens": rng.randint(4, 48)}
    if kind == "bad":
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                  b"Connection: close\r\n\r\n{\"a\":")
        data = s.recv(4096)
        s.close()
        return kind, int(data.split()[1]) if data.startswith(b"HTTP/1.1") else 0
    if kind == "chat":
        body = {"messages": [{"role": "user", "content": "Tell me a story"}],
                "max_tokens": rng.randint(4, 48), "temperature": 0.8}
    if kind == "sampled":
        body["temperature"] = 0.7
        body["seed"] = rng.randrange(1 << 30)
    if kind in ("stream", "hang_up"):
        body["stream"] = True
    r = loadgen.request(url, body, hang_up=kind == "hang_up", timeout=60)
    return kind, r["status"] if not r["error"] else f"error: {r['error']}"


out_dir = os.environ.get("BARATA_TEST_OUT", ".")
with Server("--slots", "4", "--max-queue", "4", "-t", "2", "--chat-template", "chatml",
            "--log-format", "off", model=MODEL) as s:
    rng = random.Random(7)
    curve = []
    counts = {}
    t0 = time.time()
    done = 0
    with cf.ThreadPoolExecutor(9) as ex:
        while done < N:
            batch = min(250, N - done)
            for kind, status in ex.map(lambda _: one(s.url, s.port, random.Random(rng.random())),
                                       range(batch)):
                counts[(kind, status)] = counts.get((kind, status), 0) + 1
            done += batch
            curve.append((done, rss_mb(s.proc.pid)))
            print(f"soak: {done} requests, RSS {curve[-1][1]:.1f} MB")
    wall = time.time() - t0
    bad = {k: v for k, v in counts.items()
           if not (k[1] == 200 or k[1] == 429 or (k[0] == "bad" and k[1] == 400))}
    check(not bad, f"every request answered 200, 429 or (malformed) 400: {sorted(counts.items())}")
    check(any(k[1] == 429 for k in counts), "bursts beyond 4 slots + 4 queue places got 429")
    after_warmup = [mb for n, mb in curve if n > WARMUP]
    growth = max(after_warmup) - min(after_warmup)
    check(growth <= BOUND_MB, f"RSS flat after {WARMUP} requests: it moved {growth:.1f} MB "
          f"(bound {BOUND_MB} MB) over {N - WARMUP} more; curve {[round(m, 1) for _, m in curve]}")
    for _ in range(100):
        m = s.metrics()
        if m["barata_slots_in_use"] == 0 and m["barata_queue_depth"] == 0 \
                and m["barata_kv_blocks_used"] == 0:
            break
        time.sleep(0.05)
    for g in ("barata_slots_in_use", "barata_queue_depth", "barata_kv_blocks_used"):
        check(m[g] == 0, f"{g} is back to 0")
    check(m["barata_http_connections"] <= 1, "no connection left open but /metrics' own")
    with open(os.path.join(out_dir, "soak.json"), "w") as f:
        json.dump({"requests": N, "wall_s": wall, "rss_curve_mb": curve,
                   "counts": {f"{k[0]} {k[1]}": v for k, v in counts.items()}}, f, indent=1)
    rc = s.stop()
    check(rc == 0, "the server exits 0 on SIGTERM")
print(f"test_soak: all passed ({N} requests in {wall:.0f} s)")
