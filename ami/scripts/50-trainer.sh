#!/usr/bin/env bash
# The trainer wheel in its own virtualenv, the gpufleet systemd units, and the one way jobs start containers: the
# gpufleet user (jobs run as it) is kept out of the docker group, which is root on the host; every user may run the
# launcher /usr/local/sbin/gpufleet-container as root through sudo (/etc/sudoers.d/gpufleet-container, checked with
# visudo first), and it starts only the hardened `docker run` for the caller's uid (trainer.node.container).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

venv="$(manifest .trainer.venv)"
version="$(manifest .trainer.version)"
wheel="/tmp/gpufleet-ami/$(manifest .trainer.wheel)"
[ -f "$wheel" ] || die "trainer wheel $wheel was not uploaded (build it with: pip wheel trainer/ --no-deps -w dist/)"
extra=""
[ "$GPUFLEET_CLOUD" = azure ] && extra="[azure]"

# The gpufleet user (jobs run as it) has the manifest's fixed ids: 45-slurm.sh made it.
[ "$(id -u gpufleet 2>/dev/null)" = "$(manifest .accounts.gpufleet.uid)" ] ||
  die "no gpufleet user with the manifest's uid (45-slurm.sh makes it)"
# Never in the docker group (an older image added it): the launcher below is its way to containers.
if [[ ",$(getent group docker | cut -d: -f4)," == *,gpufleet,* ]]; then
  gpasswd -d gpufleet docker >/dev/null
  log "gpufleet removed from the docker group"
fi

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# The default index's Linux x86_64 torch wheel bundles its CUDA runtime; 99-validate checks its CUDA version.
"$venv/bin/pip" install -q "torch==$(manifest .trainer.torch)"
"$venv/bin/pip" install -q "${wheel}${extra}"
installed="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("gpufleet-trainer"))')"
[ "$installed" = "$version" ] || die "trainer $installed installed, the manifest pins $version"
ln -sfn "$venv/bin/gpufleet-trainer" /usr/local/bin/gpufleet-trainer

install -d -m 0755 /etc/gpufleet /var/log/gpufleet
install -m 0755 /tmp/gpufleet-ami/files/gpufleet-scratch.sh /usr/local/sbin/gpufleet-scratch
install -m 0755 /tmp/gpufleet-ami/files/gpufleet-node-config.sh /usr/local/sbin/gpufleet-node-config
install -m 0755 /tmp/gpufleet-ami/files/gpufleet-imds-root-only.sh /usr/local/sbin/gpufleet-imds-root-only
install -m 0755 /tmp/gpufleet-ami/files/gpufleet-dns-guard-rules.sh /usr/local/sbin/gpufleet-dns-guard-rules
# The DNS guard's user (Tencent nodes): no home, no shell, no job runs as it; the DNS rules exempt it (and root) alone.
id -u gpufleet-dns-guard >/dev/null 2>&1 ||
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpufleet-dns-guard
# The launcher of jobs' containers and its sudoers rule (a file visudo refuses would stop sudo for everyone).
visudo -cf /tmp/gpufleet-ami/files/sudoers-gpufleet-container >/dev/null ||
  die "visudo refuses files/sudoers-gpufleet-container"
install -o root -g root -m 0755 /tmp/gpufleet-ami/files/gpufleet-container.sh /usr/local/sbin/gpufleet-container
install -o root -g root -m 0440 /tmp/gpufleet-ami/files/sudoers-gpufleet-container /etc/sudoers.d/gpufleet-container
install -m 0644 /tmp/gpufleet-ami/systemd/gpufleet-*.service /etc/systemd/system/
systemctl daemon-reload
# Scratch is assembled on every boot. User-data enables the rest once it wrote the settings: gpufleet-node (a Slurm
# GPU node: munge, slurmd and its notice watcher, gpufleet-watch@NAME) or gpufleet-controller (munge, slurmctld, the
# bridge, the healer); both run gpufleet-node-config first.
systemctl enable gpufleet-scratch.service
# A GPU node of a stack (node.json names the cloud; the controller has none, so each skips itself there): the metadata
# service answers only root, and each job's own credentials are served on loopback, before slurmd.
systemctl enable gpufleet-imds.service gpufleet-credentials.service
# A GPU node of a Tencent stack, whose VPC filters no DNS (on other clouds both skip themselves): jobs' DNS goes
# through the guard, which resolves only Tencent's service names.
systemctl enable gpufleet-dns-rules.service gpufleet-dns-guard.service
log "trainer $installed in $venv; units installed"
