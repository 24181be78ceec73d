#!/usr/bin/env bash
# Slurm and MUNGE, one pinned version of each for the controller and every node (ami/versions.json), built from
# their verified release tarballs into /usr/local; the accounts with fixed ids (munge, slurm, and gpufleet, the
# bridge's user, which submits each team's jobs as the team's user); their systemd units, enabled by no one:
# `gpufleet-trainer setup node|controller` writes the munge key and the daemons' settings at boot, then starts them.
# Slurm's power saving programs for the controller; the nodes' Prolog, Epilog and TaskProlog.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

account munge "$(manifest .accounts.munge.uid)" "$(manifest .accounts.munge.gid)" "$(manifest .accounts.munge.home)"
account slurm "$(manifest .accounts.slurm.uid)" "$(manifest .accounts.slurm.gid)" "$(manifest .accounts.slurm.home)"
account gpufleet "$(manifest .accounts.gpufleet.uid)" "$(manifest .accounts.gpufleet.gid)" \
  "$(manifest .accounts.gpufleet.home)"
install -d -o gpufleet -g gpufleet -m 0755 "$(manifest .accounts.gpufleet.home)"
# Jobs run as their team's user (gpufleet-<team>, made at boot from the settings' teams: trainer.slurm.users), each a
# member of gpufleet-teams; the bridge may submit and cancel as those members, nothing else.
getent group gpufleet-teams >/dev/null || groupadd --system gpufleet-teams
visudo -cf /tmp/gpufleet-ami/files/sudoers-gpufleet-bridge >/dev/null ||
  die "visudo refuses files/sudoers-gpufleet-bridge"
install -o root -g root -m 0440 /tmp/gpufleet-ami/files/sudoers-gpufleet-bridge /etc/sudoers.d/gpufleet-bridge

# The distribution's MUNGE and Slurm never come in beside the built ones (another version, other paths).
distribution_packages="munge libmunge2 libmunge-dev slurm-client slurmd slurmctld slurmdbd slurm-wlm* libslurm*"
printf 'Package: %s\nPin: version *\nPin-Priority: -1\n' "$distribution_packages" \
  >/etc/apt/preferences.d/gpufleet-no-distribution-slurm

apt_install pkg-config bzip2 xz-utils libssl-dev zlib1g-dev libbz2-dev libjson-c-dev libdbus-1-dev libhwloc-dev \
  libhttp-parser-dev libyaml-dev liblz4-dev libreadline-dev libpam0g-dev libnuma-dev linux-libc-dev \
  libmariadb-dev libmariadb-dev-compat
# Slurm's accounting on the controller (the teams' accounts, fair share, GPU limits): slurmdbd over MariaDB, both on
# loopback. Off in the image: `gpufleet-trainer setup controller` starts them; a node never does.
apt_install mariadb-server
systemctl disable --now mariadb.service

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

munge_version="$(manifest .munge.version)"
munge_prefix="$(manifest .munge.prefix)"
if [ "$("$munge_prefix/sbin/munged" --version 2>/dev/null | awk '{print $1}')" = "munge-$munge_version" ]; then
  log "munge $munge_version already installed"
else
  fetch_component munge "$work/munge.tar.xz"
  verify_signature "$work/munge.tar.xz" "$(manifest .munge.sig_url)" "$(manifest .munge.gpg_key_url)" \
    "$(manifest .munge.gpg_fingerprint)"
  install -d "$work/munge"
  tar -xJf "$work/munge.tar.xz" -C "$work/munge" --strip-components 1
  (
    cd "$work/munge"
    ./configure --prefix="$munge_prefix" --sysconfdir=/etc --localstatedir=/var --runstatedir=/run \
      --with-crypto-lib=openssl
    make -j "$(nproc)"
    make install
  )
  ldconfig
fi
# munged refuses a key directory others can write or read; the key itself comes at boot (setup).
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
install -d -o munge -g munge -m 0711 /var/lib/munge
rm -f /etc/munge/munge.key

slurm_version="$(manifest .slurm.version)"
slurm_prefix="$(manifest .slurm.prefix)"
slurm_etc="$(manifest .slurm.sysconfdir)"
if [ "$("$slurm_prefix/sbin/slurmd" -V 2>/dev/null)" = "slurm $slurm_version" ]; then
  log "slurm $slurm_version already installed"
else
  fetch_component slurm "$work/slurm.tar.bz2"
  install -d "$work/slurm"
  tar -xjf "$work/slurm.tar.bz2" -C "$work/slurm" --strip-components 1
  (
    cd "$work/slurm"
    ./configure --prefix="$slurm_prefix" --sysconfdir="$slurm_etc" --runstatedir=/run \
      --with-munge="$munge_prefix" --disable-debug
    make -j "$(nproc)"
    make install
  )
  ldconfig
fi
# What the stack relies on was built: MUNGE authentication, cgroup v2 (the base image's hierarchy; needs D-Bus),
# the JSON output the bridge reads (squeue --json), and the accounting (slurmdbd over MariaDB, multifactor priority).
for plugin in auth_munge cred_munge cgroup_v2 proctrack_cgroup task_cgroup serializer_json jobcomp_filetxt \
  accounting_storage_slurmdbd accounting_storage_mysql priority_multifactor; do
  [ -e "$slurm_prefix/lib/slurm/$plugin.so" ] || die "slurm was built without its $plugin plugin"
done
[ "$("$slurm_prefix/sbin/slurmd" -V)" = "slurm $slurm_version" ] || die "slurmd is not $slurm_version"

# The controller holds slurm.conf and gres.conf (its user-data writes them); nodes fetch them (configless).
install -d -m 0755 "$slurm_etc" /var/spool/slurmd
install -d -o slurm -g slurm -m 0755 /var/log/slurm
# Job output (the bridge's --output-dir): a directory per team below it, its user's (setup makes them at boot).
install -d -m 0755 /var/log/gpufleet /var/log/gpufleet/jobs

install -m 0644 /tmp/gpufleet-ami/systemd/munge.service /tmp/gpufleet-ami/systemd/slurmd.service \
  /tmp/gpufleet-ami/systemd/slurmctld.service /tmp/gpufleet-ami/systemd/slurmdbd.service /etc/systemd/system/
for action in resume suspend resume-fail; do
  install -m 0755 /tmp/gpufleet-ami/files/gpufleet-power.sh "/usr/local/sbin/gpufleet-$action"
done
install -m 0755 /tmp/gpufleet-ami/files/gpufleet-task-prolog.sh /usr/local/sbin/gpufleet-task-prolog
# Slurm's Prolog and Epilog on the nodes: each job's own credentials (AWS), granted and revoked (one script, its
# name saying which).
for program in prolog epilog; do
  install -m 0755 /tmp/gpufleet-ami/files/gpufleet-job-credentials.sh "/usr/local/sbin/gpufleet-$program"
done
systemctl daemon-reload
log "munge $munge_version and slurm $slurm_version in /usr/local; units installed, started at boot by setup"
