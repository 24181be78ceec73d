#!/usr/bin/env bash
# AZNFS mount helper (mount.aznfs) for the Azure stack's Azure Files NFS 4.1 mounts (cloud-init, fstab type aznfs): the
# storage account requires secure transfer, so NFS goes through the helper's TLS tunnel, one stunnel per account
# (Ubuntu's stunnel4, a dependency of the package), per Microsoft's "Encryption in transit for NFS Azure file shares".
# Installed as that page documents, from packages.microsoft.com's Ubuntu repository, with the repository's signing key
# pinned by fingerprint; the version pinned and held, the package's self-update turned off. Azure only.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if [ "$GPUFLEET_CLOUD" != azure ]; then
  log "aznfs: not on $GPUFLEET_CLOUD (the AZNFS mount helper is for Azure Files)"
  exit 0
fi
version="$(manifest .aznfs.version)"
package="$(manifest .aznfs.package)"
config="$(manifest .aznfs.config)"
ca_file="$(manifest .aznfs.ca_file)"

apt_source microsoft-prod "$(manifest .aznfs.apt_repository.uri)" "$(manifest .ubuntu.codename)" \
  "$(manifest .aznfs.apt_repository.component)" "$(manifest .aznfs.apt_repository.gpg_key_url)" \
  "$(manifest .aznfs.apt_repository.gpg_fingerprint)"
apt_pin aznfs "$(manifest .aznfs.apt_pin)" "$package"
apt-get update -q
# The Ubuntu-HPC base image may carry another version already: the manifest's replaces it, up or down. Installed
# non-interactively, the package's postinst asks nothing (and turns its self-update on: turned off below).
AZNFS_NONINTERACTIVE_INSTALL=1 apt_install --allow-downgrades "$package"
hold "$package"
installed="$(dpkg-query -W -f '${Version}' "$package")"
[ "$installed" = "$version" ] || die "$package is $installed, the manifest pins $version"

# Pinned means pinned: the daily self-update (aznfswatchdog runs aznfs_install.sh auto-update, an apt upgrade of the
# package) is off in the helper's own switch, and the watchdog that runs it is disabled: it watches Blob NFSv3 mounts,
# which the stack has none of. aznfswatchdogv4 keeps the NFSv4 TLS tunnels up; mount.aznfs refuses to mount without it.
install -d -m 0755 "$(dirname "$config")"
touch "$config"
sed -i '/^[[:space:]]*AUTO_UPDATE_AZNFS/d' "$config"
echo "AUTO_UPDATE_AZNFS=false" >>"$config"
systemctl disable --now aznfswatchdog.service
systemctl enable aznfswatchdogv4.service

# stunnel checks the Azure Files endpoint's certificate against DigiCert Global Root G2, from Ubuntu's ca-certificates;
# without that file the helper would fetch the root at mount time with certificate checks off (wget
# --no-check-certificate).
[ -s "$ca_file" ] || die "$ca_file is missing (ca-certificates): the helper would download it unverified at mount time"
[ -x /sbin/mount.aznfs ] || die "$package installed no /sbin/mount.aznfs"
log "aznfs $installed installed and held (self-update off); stunnel4 $(dpkg-query -W -f '${Version}' stunnel4) from the archive"
