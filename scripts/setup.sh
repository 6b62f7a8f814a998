#!/usr/bin/env bash
# Install the Debian packages tilewise needs to build, test and run its demo.
# Idempotent: installs only what is missing; a no-op on a machine that has all.
set -euo pipefail

packages=(
  build-essential cmake pkg-config clang clang-format libclang-rt-14-dev
  libgdal-dev gdal-bin libhdf5-dev libtiff-dev libcmocka-dev libyaml-dev libjansson-dev nettle-dev
  libonnx-dev protobuf-c-compiler libprotobuf-c-dev
  libdnnl-dev libopenblas-dev
  python3 python3-numpy python3-torch python3-torchvision python3-rasterio python3-h5py
  python3-yaml python3-gdal python3-pytest python3-onnx
)
# QGIS 3.22 for the Processing provider's tests (tests/e2e_qgis.py) and the README screenshot:
# 138 packages, 149 MB to download, 705 MiB installed, 27 s on the 2-core build machine.
# TILEWISE_QGIS=0 leaves it out (e2e_qgis then skips).
if [ "${TILEWISE_QGIS:-1}" != 0 ]; then
  packages+=(qgis python3-qgis xvfb)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "tilewise setup: installing ${missing[*]}" >&2
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "tilewise setup: missing packages (${missing[*]}) and not root; install them with apt-get" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
