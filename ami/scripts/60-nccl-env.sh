#!/usr/bin/env bash
# NCCL/EFA settings for the gpufleet units, written from what is installed (EnvironmentFile, no global exports).
# nccl.env serves the host processes; container.env (without host library paths) serves containers.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

install -d -m 0755 /etc/gpufleet
settings=()
if [ "$GPUFLEET_CLOUD" = aws ]; then
  plugin_dir="$(manifest .aws_ofi_nccl.prefix)/lib"
  [ -d /opt/amazon/efa/lib ] || die "libfabric from the EFA installer is missing"
  settings+=(FI_PROVIDER=efa FI_EFA_FORK_SAFE=1 "NCCL_SOCKET_IFNAME=^docker,lo")
  if [ -e "$plugin_dir/libnccl-net-ofi.so" ]; then
    settings+=(NCCL_NET_PLUGIN=ofi)
  elif [ ! -e "$plugin_dir/libnccl-net.so" ]; then
    die "no aws-ofi-nccl plugin library in $plugin_dir"
  fi
  libs="$plugin_dir:/opt/amazon/efa/lib:/usr/local/cuda/lib64"
  stamp="efa-installer=$(manifest .efa_installer.version) aws-ofi-nccl=$(cat "$(manifest .aws_ofi_nccl.prefix)/VERSION") nccl=$(dpkg-query -W -f '${Version}' libnccl2)"
elif [ "$GPUFLEET_CLOUD" = tencent ]; then
  # No RDMA fabric on these families: NCCL's socket transport over the VPC network.
  settings+=(NCCL_IB_DISABLE=1 "NCCL_SOCKET_IFNAME=eth0")
  libs="/usr/local/cuda/lib64"
  stamp="nccl=$(dpkg-query -W -f '${Version}' libnccl2) transport=socket"
else
  settings+=(NCCL_IB_PCI_RELAXED_ORDERING=1 UCX_IB_PCI_RELAXED_ORDERING=on "NCCL_SOCKET_IFNAME=eth0")
  libs="/usr/local/cuda/lib64"
  stamp="ofed=$(ofed_info -s 2>/dev/null | tr -d ':' || echo none)"
fi

{
  echo "# Written by ami/scripts/60-nccl-env.sh at bake time: $stamp"
  printf '%s\n' "${settings[@]}"
} >/etc/gpufleet/container.env
{
  cat /etc/gpufleet/container.env
  echo "LD_LIBRARY_PATH=$libs"
} >/etc/gpufleet/nccl.env
chmod 0644 /etc/gpufleet/nccl.env /etc/gpufleet/container.env
log "wrote /etc/gpufleet/nccl.env ($stamp)"
