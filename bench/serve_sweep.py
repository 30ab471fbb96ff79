"""Throughput and latency of an OpenAI-compatible server against the number
of concurrent clients: for each C, 4*C streaming chat requests (at least
16) of exactly --tokens tokens each... as far as the model does not stop
first (greedy; the tokens counted are the usage's). Prints a markdown table
of median-of-reps figures; --json writes every rep.

  python bench/serve_sweep.py URL [--clients 1,4,16,32] [--reps 3] [--tokens 64]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
import loadgen  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--clients", default="1,4,16,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--label", default="server")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows, raw = [], []
    # One untimed warm-up request.
    loadgen.request(a.url, loadgen.body_for(loadgen.PROMPTS[0], 8, False))
    for c in [int(x) for x in a.clients.split(",")]:
        reps = []
        for r in range(a.reps):
            s, problems = loadgen.run(a.url, n_requests=max(16, 4 * c), concurrency=c, seed=11 + r,
                                      hang_up_rate=0, max_tokens=(a.tokens, a.tokens),
                                      baseline=False, stream_rate=1.0, log=lambda *_: None)
            if problems or s["rejected_429"]:
                sys.exit(f"{a.label}: {c} clients: {len(problems)} problems, "
                         f"{s['rejected_429']} refused: {problems[:3]}")
            reps.append(s)
        raw.append({"clients": c, "reps": reps})
        med = lambda k: statistics.median(x[k] for x in reps)  # noqa: E731
        sd = lambda k: statistics.stdev(x[k] for x in reps) if len(reps) > 1 else 0  # noqa: E731
        rows.append((c, med("tokens_per_s"), sd("tokens_per_s"), med("requests_per_s"),
                     med("ttft_p50_s"), med("ttft_p99_s"), med("latency_p50_s"), med("latency_p99_s")))
        print(f"{a.label}: {c} clients done", file=sys.stderr)
    print(f"| {a.label}: clients | tokens/s (median ± sd) | requests/s | TTFT p50 | TTFT p99 | "
          "latency p50 | latency p99 |")
    print("|---|---|---|---|---|---|---|")
    for c, tps, tsd, rps, t50, t99, l50, l99 in rows:
        print(f"| {c} | {tps:.1f} ± {tsd:.1f} | {rps:.2f} | {t50 * 1e3:.0f} ms | {t99 * 1e3:.0f} ms | "
              f"{l50 * 1e3:.0f} ms | {l99 * 1e3:.0f} ms |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"label": a.label, "url": a.url, "tokens": a.tokens, "runs": raw}, f, indent=1)


if __name__ == "__main__":
    main()
