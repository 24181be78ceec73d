#!/usr/bin/env bash
# The trainer wheel in its own virtualenv, a service user, and the gpufleet systemd units.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

venv="$(manifest .trainer.venv)"
version="$(manifest .trainer.version)"
wheel="/tmp/gpufleet-ami/$(manifest .trainer.wheel)"
[ -f "$wheel" ] || die "trainer wheel $wheel was not uploaded (build it with: pip wheel trainer/ --no-deps -w dist/)"
extra=""
[ "$GPUFLEET_CLOUD" = azure ] && extra="[azure]"

id gpufleet >/dev/null 2>&1 || useradd --system --create-home --home-dir /var/lib/gpufleet --shell /usr/sbin/nologin gpufleet
getent group docker >/dev/null && usermod -aG docker gpufleet

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
install -m 0644 /tmp/gpufleet-ami/systemd/*.service /etc/systemd/system/
systemctl daemon-reload
# Scratch is assembled on every boot; preflight and the agent are enabled by user-data once node.json exists.
systemctl enable gpufleet-scratch.service
log "trainer $installed in $venv; units installed"
