#!/usr/bin/env bash
# Docker with the NVIDIA container toolkit, for containerised jobs. No job's user is in the docker group (root on the
# host): jobs start containers through the root launcher gpufleet-container (sudo; 50-trainer.sh installs it), as
# their own uid, hardened. gpufleet-docker-run IMAGE [CMD...] is its client for users' own sbatch scripts (the job's
# GPUs, the EFA/InfiniBand devices under /dev/infiniband, unlimited locked memory, the node's NCCL settings).
# No credential helper: a container job's task (trainer.slurm.task) gets a login to the stack's registry per job and
# the launcher pulls with it from a private DOCKER_CONFIG of its own, removed before the container starts
# (trainer/node/container.py), so root's and the gpufleet user's docker configs stay empty.
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
