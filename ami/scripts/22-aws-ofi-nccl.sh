#!/usr/bin/env bash
# aws-ofi-nccl: NCCL's network plugin over libfabric/EFA, built from the verified release tarball.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if [ "$GPUFLEET_CLOUD" != aws ]; then
  log "aws-ofi-nccl: not on $GPUFLEET_CLOUD (Azure: InfiniBand verbs; Tencent: TCP sockets)"
  exit 0
fi
version="$(manifest .aws_ofi_nccl.version)"
prefix="$(manifest .aws_ofi_nccl.prefix)"
if [ "$(cat "$prefix/VERSION" 2>/dev/null)" = "$version" ]; then
  log "aws-ofi-nccl $version already installed"
  exit 0
fi

apt_install autoconf automake libtool libhwloc-dev
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fetch_component aws_ofi_nccl "$work/aws-ofi-nccl.tar.gz"
tar -xzf "$work/aws-ofi-nccl.tar.gz" -C "$work" --strip-components 1
(
  cd "$work"
  ./configure --prefix="$prefix" --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
    --enable-platform-aws --disable-tests
  make -j "$(nproc)"
  make install
)
echo "$version" >"$prefix/VERSION"
echo "$prefix/lib" >/etc/ld.so.conf.d/aws-ofi-nccl.conf
ldconfig
log "aws-ofi-nccl $version installed in $prefix"
