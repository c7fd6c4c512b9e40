#!/usr/bin/env bash
# Installs what dtrain's build, tests, examples and benchmarks need, from Debian's repository.
set -euo pipefail
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends \
  cmake ninja-build g++ make \
  catch2 libthrust-dev libomp-dev \
  libcli11-dev libfmt-dev >/dev/null
echo "dtrain: dependencies installed"
