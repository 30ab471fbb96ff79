"""What the Python tests of barata serve share: starting a server on a free
loopback port, waiting for it, reading /metrics, stopping it."""
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOLLM2 = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def barata():
    path = os.environ.get("BARATA_CLI")
    if not path or not os.access(path, os.X_OK):
        sys.exit("error: BARATA_CLI names no barata binary (tests/server/run.sh sets it)")
    return path


def need_model(path=SMOLLM2):
    if not os.path.exists(path):
        sys.exit(f"error: {path} is absent: run scripts/fetch-model.sh")
    return path


def free_port_run(n, attempts=200):
    """A base port B with B .. B+n-1 all free on loopback. Drawn below the
    kernel's ephemeral range (32768 and up on Linux), where the client sockets
    of tests running beside this one cannot take B+1 between the check and
    the bind (the OS-chosen port of bind(0) is itself ephemeral)."""
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(20000, 32000 - n)
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    sys.exit(f"error: no run of {n} free loopback ports in 20000-32000")


class Server:
    """`barata serve --port 0 ARGS...`; .url once /health says ok."""

    def __init__(self, *args, model=None, log=None):
        cmd = [barata(), "serve", "-m", need_model(model or SMOLLM2), "--port", "0", *map(str, args)]
        self.log = open(log or os.devnull, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"barata serve did not start: {line!r}")
        self.url = m.group(1)
        self.port = int(self.url.rsplit(":", 1)[1])
        wait_healthy(self.url, self.proc)

    def metrics(self):
        return read_metrics(self.url)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        self.log.close()
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_healthy(url, proc=None, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server at {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200 and json.load(r).get("status") == "ok":
                    return
        except Exception:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url}/health did not say ok within {timeout} s")


def read_metrics(url, headers=None):
    req = urllib.request.Request(url + "/metrics", headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")
