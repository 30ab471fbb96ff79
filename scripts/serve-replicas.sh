#!/usr/bin/env bash
# N `barata serve` replicas behind nginx (deploy/nginx.conf), all on loopback.
#   scripts/serve-replicas.sh N PORT [barata serve flags...]
# nginx listens on PORT; the replicas on PORT+1 .. PORT+N. Each replica is
# put in nginx's pool once its /health says ok. Runs until SIGTERM or Ctrl-C,
# then stops nginx and drains the replicas (SIGTERM each). Logs and nginx's
# files are in a temporary folder, printed at the start and removed at the
# end (BARATA_KEEP_LOGS=1 keeps it).
# BARATA: the barata binary (default: build/barata).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N="${1:?usage: serve-replicas.sh N PORT [serve flags]}"
PORT="${2:?usage: serve-replicas.sh N PORT [serve flags]}"
shift 2
BARATA="${BARATA:-$ROOT/build/barata}"
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[ -x "$BARATA" ] || { echo "error: $BARATA is not built (scripts/build.sh)" >&2; exit 1; }
[ -x "$NGINX" ] || { echo "error: nginx is not installed (scripts/setup.sh)" >&2; exit 1; }
DIR="$(mktemp -d -t barata-replicas.XXXXXX)"
echo "serve-replicas: files in $DIR"
PIDS=()
cleanup() {
  [ -f "$DIR/nginx.pid" ] && kill "$(cat "$DIR/nginx.pid")" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [ "${BARATA_KEEP_LOGS:-0}" = 1 ] || rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 0' TERM INT

UPSTREAMS=""
for i in $(seq 1 "$N"); do
  p=$((PORT + i))
  "$BARATA" serve --port "$p" "$@" >"$DIR/replica-$i.log" 2>&1 &
  PIDS+=($!)
  UPSTREAMS+="    server 127.0.0.1:$p max_fails=3 fail_timeout=5s;\n"
done
for i in $(seq 1 "$N"); do
  p=$((PORT + i))
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$p/health" >/dev/null 2>&1; then break; fi
    kill -0 "${PIDS[$((i - 1))]}" 2>/dev/null || { cat "$DIR/replica-$i.log" >&2; echo "error: replica $i exited" >&2; exit 1; }
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$p/health" >/dev/null || { echo "error: replica $i is not healthy" >&2; exit 1; }
  echo "serve-replicas: replica $i ready on 127.0.0.1:$p"
done
mkdir -p "$DIR"/{client_body,proxy,fastcgi,uwsgi,scgi}
# The shipped config with this run's prefix, port and pool.
awk -v prefix="$DIR" -v port="$PORT" -v ups="$UPSTREAMS" '
  /# @UPSTREAMS@/ { printf "%s", ups; skip = 1; next }
  skip && /^ *server 127\.0\.0\.1:/ { next }
  { skip = 0; gsub("@PREFIX@", prefix); gsub("@PORT@", port); print }' \
  "$ROOT/deploy/nginx.conf" >"$DIR/nginx.conf"
"$NGINX" -t -q -p "$DIR" -c "$DIR/nginx.conf" -e "$DIR/error.log"
"$NGINX" -p "$DIR" -c "$DIR/nginx.conf" -e "$DIR/error.log" &
NGINX_PID=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { cat "$DIR/error.log" >&2; echo "error: nginx does not answer on $PORT" >&2; exit 1; }
echo "serve-replicas: nginx on http://127.0.0.1:$PORT over $N replicas"
wait "$NGINX_PID"
