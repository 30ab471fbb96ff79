"""A load generator for barata serve (or any OpenAI-compatible server):
N requests from C concurrent clients, streaming and not, greedy, some
clients hanging up after the first event. Every reply is checked: a
complete answer is well formed and equals the same request run alone
(greedy), a refusal is a 429 with Retry-After. Prints p50/p99 TTFT and
latency; --json writes them.

  python tests/server/loadgen.py URL [--requests 200] [--concurrency 32] ...
"""
import argparse
import concurrent.futures as cf
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain what a CPU cache is in one sentence.",
    "Give me a name for a cat.",
    "What does HTTP stand for?",
    "Count from one to five.",
    "Say hello in Spanish.",
]


def body_for(prompt, max_tokens, stream, chat=True):
    b = {"max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    if chat:
        b["messages"] = [{"role": "user", "content": prompt}]
    else:
        b["prompt"] = prompt
    return b


def request(url, body, hang_up=False, headers=None, timeout=300):
    """One request. Returns a dict: status, text, finish, ttft_s, latency_s,
    retry_after, error (what was wrong with the reply, if anything)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    chat = "messages" in body
    h = {"Content-Type": "application/json", **(headers or {})}
    t0 = time.perf_counter()
    out = {"status": 0, "text": "", "finish": None, "ttft_s": None, "latency_s": None,
           "retry_after": None, "error": None, "hung_up": False, "tokens": 0}
    try:
        conn.request("POST", path, json.dumps(body), h)
        r = conn.getresponse()
        out["status"] = r.status
        out["retry_after"] = r.getheader("Retry-After")
        if r.status != 200:
            j = json.loads(r.read())
            if "error" not in j or "message" not in j["error"]:
                out["error"] = f"an error reply without error.message: {j}"
            return out
        if not body.get("stream"):
            j = json.loads(r.read())
            out["latency_s"] = time.perf_counter() - t0  # TTFT is a stream's
            c = j["choices"][0]
            out["text"] = c["message"]["content"] if chat else c["text"]
            out["finish"] = c["finish_reason"]
            u = j["usage"]
            out["tokens"] = u["completion_tokens"]
            if u["total_tokens"] != u["prompt_tokens"] + u["completion_tokens"]:
                out["error"] = f"usage does not add up: {u}"
            return out
        # SSE: "data: {...}" lines and blank lines, ending with data: [DONE].
        done = False
        n_pieces = 0
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().rstrip("\r\n")
            if not line:
                continue
            if not line.startswith("data: "):
                out["error"] = f"not an SSE data line: {line!r}"
                return out
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            j = json.loads(data)
            if "error" in j:
                out["error"] = f"error event: {j}"
                return out
            if j.get("usage"):
                out["tokens"] = j["usage"]["completion_tokens"]
            if not j.get("choices"):
                continue
            c = j["choices"][0]
            piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
            n_pieces += 1 if piece else 0
            if piece and out["ttft_s"] is None:
                out["ttft_s"] = time.perf_counter() - t0
            out["text"] += piece or ""
            if c.get("finish_reason"):
                out["finish"] = c["finish_reason"]
            if hang_up:
                out["hung_up"] = True
                return out
        out["latency_s"] = time.perf_counter() - t0
        out["tokens"] = out["tokens"] or n_pieces  # a server without include_usage
        if not done:
            out["error"] = "the stream ended without data: [DONE]"
        elif out["finish"] not in ("stop", "length"):
            out["error"] = f"finish_reason {out['finish']!r}"
        return out
    except Exception as e:  # noqa: BLE001 - every failure is reported
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    finally:
        conn.close()


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    k = min(len(v) - 1, max(0, int(round(p / 100 * (len(v) - 1)))))
    return v[k]


def run(url, n_requests=200, concurrency=32, seed=1, hang_up_rate=0.1, max_tokens=(8, 24),
        baseline=True, headers=None, log=print, stream_rate=0.5):
    rng = random.Random(seed)
    jobs = []
    for i in range(n_requests):
        prompt = PROMPTS[rng.randrange(len(PROMPTS))]
        mt = rng.randint(*max_tokens)
        stream = rng.random() < stream_rate
        hang = stream and rng.random() < hang_up_rate
        jobs.append((prompt, mt, stream, hang))

    # Each distinct request once, alone: what every loaded reply must equal.
    expected = {}
    if baseline:
        for prompt, mt, _, _ in jobs:
            if (prompt, mt) in expected:
                continue
            r = request(url, body_for(prompt, mt, False), headers=headers)
            if r["status"] != 200 or r["error"]:
                raise AssertionError(f"baseline request failed: {r}")
            expected[(prompt, mt)] = r["text"]

    t0 = time.perf_counter()
    lock = threading.Lock()
    results = [None] * n_requests

    def one(i):
        prompt, mt, stream, hang = jobs[i]
        r = request(url, body_for(prompt, mt, stream), hang_up=hang, headers=headers)
        with lock:
            results[i] = r

    with cf.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(one, range(n_requests)))
    wall = time.perf_counter() - t0

    problems = []
    ok = rejected = hung = 0
    for i, r in enumerate(results):
        prompt, mt, stream, hang = jobs[i]
        if r["error"]:
            problems.append(f"request {i} ({'stream' if stream else 'plain'}): {r['error']}")
        elif r["status"] == 429:
            rejected += 1
            try:
                ra = int(r["retry_after"])
            except (TypeError, ValueError):
                ra = 0
            if ra < 1:
                problems.append(f"request {i}: 429 without a Retry-After of 1 s or more")
        elif r["status"] != 200:
            problems.append(f"request {i}: HTTP {r['status']}")
        elif r["hung_up"]:
            hung += 1
        else:
            ok += 1
            if baseline and r["text"] != expected[(prompt, mt)]:
                problems.append(f"request {i}: {r['text']!r} differs from the same request "
                                f"alone: {expected[(prompt, mt)]!r}")
    done = [r for r in results if r["status"] == 200 and not r["hung_up"] and not r["error"]]
    ttft = [r["ttft_s"] for r in done if r["ttft_s"] is not None]
    lat = [r["latency_s"] for r in done if r["latency_s"] is not None]
    summary = {
        "requests": n_requests, "concurrency": concurrency, "completed": ok, "rejected_429": rejected,
        "hung_up": hung, "problems": len(problems), "wall_s": wall,
        "requests_per_s": ok / wall if wall > 0 else 0,
        "tokens": sum(r["tokens"] for r in done),
        "tokens_per_s": sum(r["tokens"] for r in done) / wall if wall > 0 else 0,
        "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
        "latency_p50_s": pct(lat, 50), "latency_p99_s": pct(lat, 99),
        "latency_mean_s": statistics.mean(lat) if lat else float("nan"),
    }
    log(f"load: {n_requests} requests, {concurrency} clients: {ok} completed, {rejected} got 429, "
        f"{hung} hung up, {len(problems)} problems, {wall:.1f} s; TTFT p50 "
        f"{summary['ttft_p50_s'] * 1e3:.0f} ms p99 {summary['ttft_p99_s'] * 1e3:.0f} ms; "
        f"latency p50 {summary['latency_p50_s'] * 1e3:.0f} ms p99 "
        f"{summary['latency_p99_s'] * 1e3:.0f} ms")
    for p in problems[:20]:
        log("problem: " + p)
    return summary, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--hang-up-rate", type=float, default=0.1)
    ap.add_argument("--max-tokens", type=int, nargs=2, default=(8, 24))
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    summary, problems = run(a.url, a.requests, a.concurrency, a.seed, a.hang_up_rate,
                            tuple(a.max_tokens), not a.no_baseline)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
