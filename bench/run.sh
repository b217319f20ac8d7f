#!/usr/bin/env bash
# Runs pgxlock's benchmark suite from a fresh clone:
#
#   bash bench/run.sh                 # full run, < 15 min on 2 cores
#   bash bench/run.sh -quick          # smoke run, < 60 s
#   bash bench/run.sh -out results/x  # any pgxlockbench flag
#
# Needs Go and the PostgreSQL server binaries (or DATABASE_URL). Redis: the
# one at REDIS_ADDR (default 127.0.0.1:6379), else redis-server is started on
# a free port if installed. etcd: Debian's etcd-server is installed here when
# missing (root or sudo; the service the package starts is stopped again),
# and the suite starts its own etcd on free loopback ports and stops it. A
# peer whose server cannot be had is reported unavailable; the run goes on.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"

if ! command -v etcd >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if command -v apt-get >/dev/null 2>&1 && { [ -z "$sudo" ] || sudo -n true 2>/dev/null; }; then
    echo "installing etcd-server (apt-get)..." >&2
    export DEBIAN_FRONTEND=noninteractive
    if $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends etcd-server >/dev/null; then
      # The package may start a system etcd on 2379; the suite runs its own.
      $sudo service etcd stop >/dev/null 2>&1 || true
    else
      echo "etcd-server could not be installed: the etcd peer will be reported unavailable" >&2
    fi
  else
    echo "no etcd and no apt-get/sudo: the etcd peer will be reported unavailable" >&2
  fi
fi

exec go run ./cmd/pgxlockbench "$@"
