# SPDX-License-Identifier: Apache-2.0
# Shared by scripts/test and scripts/demo: install Debian packages that are missing, build.

KVGATE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Everything the build, the tests and the demo use, all Debian 12 packages (prometheus brings
# promtool, for deploy/prometheus, and the server the integration tests scrape kvgate with; gdb
# gives the backtraces of a test driver that hangs).
KVGATE_PACKAGES=(
  build-essential meson ninja-build pkg-config clang libclang-rt-14-dev
  libevent-dev libnghttp2-dev libssl-dev libxxhash-dev libhiredis-dev libcmocka-dev
  libhttp-parser-dev python3-xxhash python3-cbor2 python3-jinja2
  libzmq3-dev libmsgpack-dev python3-zmq python3-msgpack
  curl openssl procps nghttp2-client python3 python3-pytest python3-h2 python3-httpx python3-redis
  redis-server prometheus gdb
)

kvg_install_missing() {
  local missing=()
  local p
  for p in "${KVGATE_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # Node.js and npm install the tests' oracles (tests/integration/npm_oracle.py); a machine that
  # has them from elsewhere (NodeSource's nodejs bundles npm) keeps its own.
  command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "==> installing: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# kvg_build DIR [meson options...]: configure once, then compile.
kvg_build() {
  local dir=$1; shift
  local log
  log=$(mktemp)
  if [ ! -f "$KVGATE_ROOT/$dir/build.ninja" ]; then
    meson setup "$KVGATE_ROOT/$dir" "$KVGATE_ROOT" "$@" >"$log" 2>&1 || { cat "$log"; rm -f "$log"; return 1; }
  fi
  meson compile -C "$KVGATE_ROOT/$dir" >"$log" 2>&1 || { cat "$log"; rm -f "$log"; return 1; }
  rm -f "$log"
}

# Debian's pytest and h2 live in the system python; a pyenv python on PATH lacks them.
KVGATE_PYTHON=/usr/bin/python3
