#!/usr/bin/env bash
# Installs what building and testing rdzv needs, from Debian's packages, when it is missing:
# etcd (the server the tests start), protoc (etcd-client's build), cmake/g++/GoogleTest (C++),
# Gloo (the C++ binding's Gloo adapter, its example and test), libabigail's abidw and abidiff
# (the ABI check, scripts/abi-check.sh), stress-ng (a CPU-starved peer keeps its place:
# tests/all/peers.rs), Prometheus (the server that scrapes `rdzv run --metrics-port` in
# cli/tests/launcher/events.rs).
set -euo pipefail
need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v cmake >/dev/null || need+=(cmake)
command -v c++ >/dev/null || need+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
[ -f /usr/include/gloo/rendezvous/store.h ] || need+=(libgloo-dev)
command -v valgrind >/dev/null || need+=(valgrind)
command -v openssl >/dev/null || need+=(openssl)
command -v ip >/dev/null || need+=(iproute2)
command -v abidiff >/dev/null || need+=(abigail-tools)
command -v stress-ng >/dev/null || need+=(stress-ng)
command -v prometheus >/dev/null || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "installing: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -m pytest --version >/dev/null 2>&1 || python3 -m pip install -q pytest
