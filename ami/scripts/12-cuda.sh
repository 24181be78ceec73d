#!/usr/bin/env bash
# CUDA toolkit from NVIDIA's repository, pinned to the manifest version.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if ships_with_base cuda; then
  log "cuda: provided by the Azure HPC base image"
  exit 0
fi
package="$(manifest .cuda.package)"
version="$(manifest .cuda.version)"
apt_pin cuda "$(manifest .cuda.apt_pin)" "$package"
apt_install "$package"
hold "$package"
major_minor="${version%.*}"
ln -sfn "/usr/local/cuda-$major_minor" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version | grep -q "release $major_minor" || die "nvcc is not CUDA $major_minor"
log "cuda $version installed"
