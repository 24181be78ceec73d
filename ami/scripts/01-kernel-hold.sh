#!/usr/bin/env bash
# Hold the running kernel (after the post-upgrade reboot) so the DKMS-built NVIDIA and EFA modules keep matching it.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

apt_install "linux-headers-$(uname -r)"
# The kernel that is running now is the one the modules are built for; hold it and its meta packages.
mapfile -t kernel_pkgs < <(dpkg-query -W -f '${Package}\n' 'linux-image-*' 'linux-headers-*' 'linux-modules-*' \
  'linux-aws' 'linux-azure' 'linux-generic' 2>/dev/null | grep -E "$(uname -r)|^linux-(aws|azure|generic|image-aws|image-azure|headers-aws|headers-azure)$" || true)
[ "${#kernel_pkgs[@]}" -gt 0 ] || die "no kernel packages found to hold"
hold "${kernel_pkgs[@]}"
log "held kernel packages: ${kernel_pkgs[*]}"
