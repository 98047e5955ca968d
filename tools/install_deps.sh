#!/usr/bin/env bash
# Installs everything moet needs to build and test on a fresh Debian 12 machine.
# Idempotent: apt and pip skip what is already present. Run as root (or with sudo available).
# CUDA is optional: when nvcc is on PATH (or in /usr/local/cuda/bin) the CUDA targets build too.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 python3-pip clang libclang-rt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libpcre2-dev libutf8proc-dev zlib1g-dev libxxhash-dev liburing-dev libboost-dev libzstd-dev libssl-dev
  chromium
)
PIP_PACKAGES=(pytest numpy ml_dtypes tokenizers jinja2 safetensors openai prometheus-client jsonschema)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install_deps] apt: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[install_deps] apt: all present"
fi

PY=${PYTHON:-python3}
if ! $PY -c "import pytest, numpy, ml_dtypes, tokenizers, jinja2, safetensors, openai, prometheus_client, jsonschema" 2>/dev/null; then
  echo "[install_deps] pip: ${PIP_PACKAGES[*]}"
  $PY -m pip install -q "${PIP_PACKAGES[@]}" || $PY -m pip install -q --break-system-packages "${PIP_PACKAGES[@]}"
else
  echo "[install_deps] pip: all present"
fi
