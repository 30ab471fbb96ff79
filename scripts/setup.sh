#!/usr/bin/env bash
# Installs the Debian packages barata builds with. Idempotent: when every
# package is already installed it prints one line and touches nothing.
set -euo pipefail

PACKAGES=(
  cmake g++ make ninja-build pkg-config
  libcli11-dev libfmt-dev libspdlog-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libpcre2-dev libedit-dev libcpp-httplib-dev
  clang clang-format libclang-rt-dev
  python3 python3-venv
  # barata serve's tests: nginx (scale-out), headless Chromium (the web page)
  nginx curl chromium chromium-driver
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
