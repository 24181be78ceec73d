#!/usr/bin/env bash
# AWS EFA installer (kernel module, libfabric with the efa provider, Open MPI), verified by sha256 and by
# its GPG signature against the pinned key fingerprint. Azure uses the InfiniBand stack of its HPC image;
# Tencent's GN10Xp/GN7/GT4 have no RDMA fabric (NCCL runs over TCP).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if [ "$GPUFLEET_CLOUD" != aws ]; then
  log "efa: not on $GPUFLEET_CLOUD (EFA is AWS's fabric)"
  exit 0
fi
version="$(manifest .efa_installer.version)"
if grep -qs "EFA installer version: $version" /opt/amazon/efa_installed_packages; then
  log "efa installer $version already installed"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fetch_component efa_installer "$work/efa.tar.gz"

export GNUPGHOME="$work/gnupg"
install -d -m 0700 "$GNUPGHOME"
curl -fsSL --retry 3 -o "$work/efa.key" "$(manifest .efa_installer.gpg_key_url)"
curl -fsSL --retry 3 -o "$work/efa.tar.gz.sig" "$(manifest .efa_installer.sig_url)"
gpg --batch --quiet --import "$work/efa.key"
fingerprint="$(gpg --batch --with-colons --fingerprint | awk -F: '$1 == "fpr" {print $10; exit}')"
[ "$fingerprint" = "$(manifest .efa_installer.gpg_fingerprint)" ] || die "EFA key fingerprint $fingerprint is not the pinned one"
gpg --batch --verify "$work/efa.tar.gz.sig" "$work/efa.tar.gz" || die "EFA installer signature does not verify"

tar -xzf "$work/efa.tar.gz" -C "$work"
(cd "$work/aws-efa-installer" && ./efa_installer.sh -y)
grep -qs "EFA installer version: $version" /opt/amazon/efa_installed_packages || die "EFA installer $version did not record itself"
mapfile -t efa_pkgs < <(dpkg-query -W -f '${Package}\n' 'efa*' 'libfabric*' 'rdma-core' 'ibverbs-*' 2>/dev/null)
[ "${#efa_pkgs[@]}" -eq 0 ] || hold "${efa_pkgs[@]}"
log "efa installer $version installed"
