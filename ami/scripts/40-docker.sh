#!/usr/bin/env bash
# Docker with the NVIDIA container toolkit, for containerised jobs. gpufleet-docker-run adds the GPUs,
# the EFA/InfiniBand devices under /dev/infiniband, unlimited locked memory and the node's NCCL settings.
# No credential helper: a container job's task (trainer.slurm.task) logs in to the stack's registry per job through the
# node's identity and hands docker a private DOCKER_CONFIG (trainer/node/registry.py), so root's and the gpufleet
# user's docker configs stay empty.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if ships_with_base docker; then
  log "docker and the nvidia container toolkit: provided by the Azure HPC base image"
else
  docker_pkg="$(manifest .docker.package)"
  toolkit_pkgs=(nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1)
  apt_pin docker "$(manifest .docker.apt_pin)" "$docker_pkg"
  apt_pin nvidia-container-toolkit "$(manifest .nvidia_container_toolkit.apt_pin)" "${toolkit_pkgs[*]}"
  apt_install "$docker_pkg" nvidia-container-toolkit
  hold "$docker_pkg" "${toolkit_pkgs[@]}"
fi

nvidia-ctk runtime configure --runtime=docker --set-as-default
# Locked memory must be unlimited for EFA/InfiniBand memory registration inside containers.
tmp="$(mktemp)"
jq '."default-ulimits".memlock = {"Name": "memlock", "Hard": -1, "Soft": -1}' /etc/docker/daemon.json >"$tmp"
install -m 0644 "$tmp" /etc/docker/daemon.json
rm -f "$tmp"
install -m 0755 /tmp/gpufleet-ami/files/gpufleet-docker-run.sh /usr/local/bin/gpufleet-docker-run
systemctl enable docker.service
systemctl restart docker.service
log "docker $(docker version --format '{{.Server.Version}}') with $(nvidia-ctk --version | head -n1)"
