#!/usr/bin/env bash
# Installs what dtrain's build, tests, examples and benchmarks need, from Debian's repository:
# Boost.Asio and OpenSSL's libcrypto for the TCP transport; Open MPI (mpirun tests, peer bench),
# Gloo and ZeroMQ (peer benches); iproute2 for the network-namespace test; clang's libFuzzer; Python
# for the layering check; Eigen, zlib and the Fashion-MNIST data for the example; libtorch, PyTorch
# and Python's headers for the torch.distributed backend (extensions/torch_backend) and its tests;
# and, from PyPI, `expecttest` (no Debian package has it) in a virtual environment beside Debian's
# Python (/opt/dtrain/python, which sees Debian's torch), for PyTorch's own distributed test suite.
#   --bench  also the Python side of the benchmarks: OpenBLAS for PyTorch (the DDP peer), and
#            matplotlib for the plots.
#   --torch2 also torch 2 from PyPI (TORCH2_VERSION below, with its CUDA libraries: about 5.4 GB)
#            and expecttest, in a virtual environment of their own (/opt/dtrain/torch2), for CI's
#            torch 2 tier (.ci/run): the backend built against it, and FSDP's and DeviceMesh's calls.
set -euo pipefail
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends \
  cmake ninja-build g++ make \
  catch2 libthrust-dev libomp-dev \
  libcli11-dev libfmt-dev \
  libboost-dev libssl-dev \
  openmpi-bin libopenmpi-dev libgloo-dev libzmq3-dev pkg-config \
  iproute2 clang-14 libclang-rt-14-dev python3 \
  libeigen3-dev zlib1g-dev dataset-fashion-mnist gzip \
  libtorch-dev python3-torch python3-dev pybind11-dev python3-venv >/dev/null
suite_python=/opt/dtrain/python/bin/python
if ! "$suite_python" -c "import expecttest, torch" >/dev/null 2>&1; then
  $sudo /usr/bin/python3 -m venv --system-site-packages /opt/dtrain/python
  $sudo "$suite_python" -m pip install -q --disable-pip-version-check expecttest
fi
TORCH2_VERSION=2.15.0
torch2_python=/opt/dtrain/torch2/bin/python
if [ "${1:-}" = "--torch2" ] && ! "$torch2_python" -c "import expecttest, numpy, torch
assert torch.__version__.split('+')[0] == '$TORCH2_VERSION'" >/dev/null 2>&1; then
  $sudo /usr/bin/python3 -m venv /opt/dtrain/torch2
  $sudo "$torch2_python" -m pip install -q --disable-pip-version-check "torch==$TORCH2_VERSION" expecttest numpy
fi
if [ "${1:-}" = "--bench" ]; then
  $sudo apt-get install -y -qq --no-install-recommends \
    libopenblas0-pthread python3-matplotlib >/dev/null
fi
echo "dtrain: dependencies installed"
