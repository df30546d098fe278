#!/usr/bin/env bash
# Set up loip on a fresh Debian 12 machine: install the Debian packages it builds with (sudo
# when not root), configure and build into build/, then (unless --no-run) run the main job: the
# bundled model on 3 local devices that offload part of it. Usage: recipes/setup-debian.sh [--no-run] [--build-dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

run_main=1
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --no-run) run_main=0 ;;
    --build-dir) build="$2"; shift ;;
    -h|--help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup-debian.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

packages=(build-essential cmake pkg-config luajit2 libluajit2-5.1-dev lua-cjson lua-busted
          libedit-dev liburing-dev libzmq3-dev libczmq-dev libmicrohttpd-dev libcurl4-openssl-dev libpcre2-dev
          libssl-dev  # libcrypto: SHA-256 and HMAC (store hashes, beacon proofs)
          iproute2   # ip, tc, ss: loip testbed (network namespaces shaped by tbf)
          chromium   # headless: spec/integration/dashboard_spec.lua loads loip serve's page in it
          openssh-client openssh-server)  # recipes/deploy over ssh; its spec runs a loopback sshd
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# luajit2 is Debian's maintained LuaJIT (the OpenResty branch); loip embeds it.
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"

# The official OpenAI client (npm), which the server's tests drive unchanged, and zod (its
# structured outputs' schemas): the versions pinned in tests/openai/package-lock.json, into
# tests/openai/node_modules (again when the lock file changed since).
if command -v npm >/dev/null 2>&1; then
  [ tests/openai/node_modules/.package-lock.json -nt tests/openai/package-lock.json ] ||
    (cd tests/openai && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  # (and Anthropic's client, for /v1/messages: tests/anthropic/package-lock.json)
  [ tests/anthropic/node_modules/.package-lock.json -nt tests/anthropic/package-lock.json ] ||
    (cd tests/anthropic && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
else
  echo "setup: npm not found: the OpenAI client test of loip serve will be skipped" >&2
fi

if [ "$run_main" -eq 1 ]; then
  # The main job: the bundled model on 3 local devices (worker processes) whose budgets force
  # some blocks to be re-read from disk every step, over links emulated at 100 Mbit/s and 2 ms.
  # It prints the plan, the text (the same as one device's), and per-device timings per token.
  store="$build/stories260K-store"
  [ -f "$store/manifest.json" ] || "$build/loip" slice models/stories260K "$store"
  "$build/loip" generate --model "$store" --devices 3 --mem 740K,720K,750K --threads 1 \
    --context 256 --link-rate 100mbit --link-delay 2ms \
    --prompt "Once upon a time" --temperature 0 --max-tokens 120
fi
