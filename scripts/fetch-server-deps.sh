#!/usr/bin/env bash
# The Python side of barata serve's tests: a virtual environment in
# .venv-server/ (git-ignored) with the openai client, Selenium, jsonschema
# (the structured-output test) and Jinja2 (the chat-template test) from PyPI,
# pinned. Idempotent: prints the environment's python when it is complete.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-server"
PINS=(openai==1.59.7 selenium==4.27.1 jsonschema==4.23.0 Jinja2==3.1.4)
STAMP="$VENV/.pins"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "${PINS[*]}" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
echo "fetch-server-deps: creating $VENV with ${PINS[*]}" >&2
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" >&2
echo "${PINS[*]}" >"$STAMP"
echo "$VENV/bin/python"
