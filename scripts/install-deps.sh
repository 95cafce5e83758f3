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
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then exit 0; fi
echo "dsinfer: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
