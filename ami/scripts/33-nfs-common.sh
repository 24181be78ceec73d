#!/usr/bin/env bash
# nfs-common (mount.nfs, mount.nfs4, nfsidmap) from Ubuntu's archive, pinned and held, on every cloud: the stacks'
# shared file systems are NFS. Tencent Cloud's CFS mounts are plain NFS (v4.0, type nfs4); AWS's efs-utils
# (32-efs-utils.sh) and Azure's AZNFS mount helper (34-aznfs.sh) mount through it too and declare it a dependency.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

version="$(manifest .nfs_common.version)"
listed="$(manifest '.nfs_common.packages[]')"
mapfile -t packages <<<"$listed"
apt_pin nfs-common "$(manifest .nfs_common.apt_pin)" "${packages[*]}"
apt_install "${packages[@]}"
hold "${packages[@]}"

# dpkg's version of nfs-utils carries an epoch ("1:"); the manifest pins the upstream version.
installed="$(dpkg-query -W -f '${Version}' nfs-common)"
[[ "${installed#*:}" == "$version"-* ]] || die "nfs-common is $installed, the manifest pins $version"
[ -x /sbin/mount.nfs ] || die "nfs-common installed no /sbin/mount.nfs"
log "nfs-common $installed installed and held"
