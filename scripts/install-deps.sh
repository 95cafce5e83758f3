#!/usr/bin/env bash
# Installs the system packages dsinfer needs to build and test (Debian/Ubuntu), only those
# that are missing. Safe to run repeatedly.
set -euo pipefail
# libssl-dev: SHA-256 of state blobs (core/sha256.h); libzmq3-dev + libmsgpack-dev: the KV-event
# publisher (vLLM's ZMQ + msgpack wire format); libicu-dev: Unicode normalisation of the V4.1
# Engram token map; libucx-dev: the prefill/decode KV transfer (src/transfer, ucp one-sided get).
pkgs=(cmake ninja-build g++ pkg-config libgtest-dev nlohmann-json3-dev libpcre2-dev libboost-dev libssl-dev
  ccache libzmq3-dev libmsgpack-dev libicu-dev libucx-dev)
if [[ "${DSINFER_WITH_CLANG:-0}" == 1 ]]; then pkgs+=(clang libclang-rt-14-dev); fi
# ucx-utils: ucx_perftest, the reference of tests/router/pd_bandwidth.py (docs/PERF.md).
pkgs+=(ucx-utils)
# curl + ca-certificates: the xgrammar source archive below.
pkgs+=(curl ca-certificates)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
  echo "dsinfer: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# xgrammar's C++ core (the structured-output grammar engine, src/grammar) from its PyPI source
# distribution, pinned by version and sha256; cmake/Xgrammar.cmake builds its static library
# from this archive (without the Python bindings). Cached in the ignored .deps/ (a machine without
# network, e.g. a GPU box, gets it with the tree) or $DSINFER_DEPS_CACHE; fetched once.
xgrammar_version=0.2.8
xgrammar_sha256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
xgrammar_url=https://files.pythonhosted.org/packages/03/0f/29f521535729be740779c2c98b630ef6607cf28be9b669895dd2b821ff63/xgrammar-$xgrammar_version.tar.gz
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DSINFER_DEPS_CACHE:-$root/.deps}"
archive="$cache/xgrammar-$xgrammar_version.tar.gz"
if ! echo "$xgrammar_sha256  $archive" | sha256sum -c --status 2>/dev/null; then
  mkdir -p "$cache"
  echo "dsinfer: fetching xgrammar $xgrammar_version (PyPI sdist)" >&2
  curl -fsSL --retry 3 -o "$archive.part" "$xgrammar_url"
  if ! echo "$xgrammar_sha256  $archive.part" | sha256sum -c --status; then
    rm -f "$archive.part"
    echo "dsinfer: xgrammar archive does not match its pinned sha256" >&2
    exit 1
  fi
  mv "$archive.part" "$archive"
fi
