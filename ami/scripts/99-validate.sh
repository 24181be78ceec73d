#!/usr/bin/env bash
# Final check on the GPU build instance: every component answers and its version is the manifest's.
# Writes /etc/gpufleet/image-versions.json (manifest + what was observed), for people to read.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

failures=0
observed="{}"
# check NAME ACTUAL EXPECTED: ACTUAL is EXPECTED, or EXPECTED plus a Debian revision ("-...").
check() {
  observed="$(jq --arg k "$1" --arg v "$2" '.[$k] = $v' <<<"$observed")"
  if [[ "$2" == "$3" || "$2" == "$3"-* ]]; then
    log "ok   $1 $2"
  else
    log "FAIL $1 is '$2', expected '$3'"
    failures=$((failures + 1))
  fi
}
record() { observed="$(jq --arg k "$1" --arg v "$2" '.[$k] = $v' <<<"$observed")"; log "seen $1 $2"; }

gpus="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
[ "$gpus" -gt 0 ] || die "nvidia-smi sees no GPU: build on a GPU instance type"
driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
branch="$(manifest .nvidia_driver.branch)"
trainer_python="$(manifest .trainer.venv)/bin/python"
torch_cuda="$("$trainer_python" -c 'import torch; assert torch.cuda.is_available(); print(torch.version.cuda)')"
check torch_cuda "$torch_cuda" "$(manifest .trainer.torch_cuda)"
check trainer "$("$trainer_python" -c 'import importlib.metadata as m; print(m.version("gpufleet-trainer"))')" "$(manifest .trainer.version)"
# What the image starts: the units (setup, the bridge, the watcher and healer, job credentials), Slurm's power saving
# programs (nodes), Prolog and Epilog (credentials), every job's batch script (task) and the container launcher
# (container), the DNS guard (dns).
for command in setup controller nodes task credentials container dns; do
  "$trainer_python" -m trainer "$command" --help >/dev/null || die "python -m trainer $command does not start"
done
check slurm "$("$(manifest .slurm.prefix)/sbin/slurmd" -V | awk '{print $2}')" "$(manifest .slurm.version)"
check munge "$("$(manifest .munge.prefix)/sbin/munged" --version | awk '{print $1}' | sed 's/^munge-//')" "$(manifest .munge.version)"
check slurm_uid "$(id -u slurm)" "$(manifest .accounts.slurm.uid)"
check gpufleet_uid "$(id -u gpufleet)" "$(manifest .accounts.gpufleet.uid)"
# Jobs start containers only through the launcher, as their own uid: the docker group would be root on the host.
[[ " $(id -nG gpufleet) " != *" docker "* ]] || die "gpufleet is in the docker group, which is root on the host"
visudo -cf /etc/sudoers.d/gpufleet-container >/dev/null || die "visudo refuses /etc/sudoers.d/gpufleet-container"
[ "$(stat -c '%U:%G %a' /usr/local/sbin/gpufleet-container)" = "root:root 755" ] ||
  die "/usr/local/sbin/gpufleet-container is not root's, mode 0755"
[ "$(stat -c '%U:%G %a' /etc/sudoers.d/gpufleet-container)" = "root:root 440" ] ||
  die "/etc/sudoers.d/gpufleet-container is not root's, mode 0440"
runuser -u gpufleet -- sudo -n /usr/local/sbin/gpufleet-container --help >/dev/null ||
  die "gpufleet cannot start gpufleet-container through sudo (python -m trainer container)"
# The bridge submits each team's jobs as the team's user (a member of gpufleet-teams), through its own sudoers rule.
getent group gpufleet-teams >/dev/null || die "no group gpufleet-teams (the teams' users join it at boot)"
visudo -cf /etc/sudoers.d/gpufleet-bridge >/dev/null || die "visudo refuses /etc/sudoers.d/gpufleet-bridge"
[ "$(stat -c '%U:%G %a' /etc/sudoers.d/gpufleet-bridge)" = "root:root 440" ] ||
  die "/etc/sudoers.d/gpufleet-bridge is not root's, mode 0440"
for unit in munge slurmd slurmctld slurmdbd mariadb; do
  ! systemctl is-enabled --quiet "$unit.service" || die "$unit.service is enabled; gpufleet setup starts it at boot"
done
# On a node the metadata service answers only root and each job gets credentials of its own, before slurmd starts
# (both units skip themselves on the controller, which has no node.json).
for unit in gpufleet-imds gpufleet-credentials; do
  systemctl is-enabled --quiet "$unit.service" || die "$unit.service is not enabled: jobs would hold the node's identity"
done
command -v iptables >/dev/null || die "iptables is missing: gpufleet-imds-root-only needs it (00-base.sh)"
# On a Tencent node every job's DNS query passes the guard, which runs as a user of its own (no team's).
for unit in gpufleet-dns-rules gpufleet-dns-guard; do
  systemctl is-enabled --quiet "$unit.service" || die "$unit.service is not enabled: jobs would resolve any name"
done
id -u gpufleet-dns-guard >/dev/null || die "no user gpufleet-dns-guard: the DNS guard runs as it (50-trainer.sh)"
# The stacks' shared file systems are NFS on every cloud (Tencent's CFS directly; efs-utils and aznfs through it).
[ -x /sbin/mount.nfs ] || die "/sbin/mount.nfs is missing: the shared file system mounts need it (33-nfs-common.sh)"
check nfs_common "$(dpkg-query -W -f '${Version}' nfs-common | sed 's/^[0-9]*://')" "$(manifest .nfs_common.version)"
apt-mark showhold | grep -qx nfs-common || die "nfs-common is not held"
toolkit="$(nvidia-ctk --version | awk '/version/ {print $NF; exit}')"
docker info --format '{{json .Runtimes}}' | grep -q nvidia || die "docker has no nvidia runtime"

if [ "$GPUFLEET_CLOUD" != azure ]; then
  check nvidia_driver "$driver" "$(manifest .nvidia_driver.version)"
  check docker "$(dpkg-query -W -f '${Version}' "$(manifest .docker.package)")" "$(manifest .docker.version)"
  check nvidia_container_toolkit "$toolkit" "$(manifest .nvidia_container_toolkit.version)"
  check fabric_manager "$(dpkg-query -W -f '${Version}' "nvidia-fabricmanager-$branch")" "$(manifest .fabric_manager.version)"
  check cuda "$(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" "$(manifest .cuda.version | cut -d. -f1-2)"
  check nccl "$(dpkg-query -W -f '${Version}' libnccl2)" "$(manifest .nccl.apt_pin)"
  check dcgm "$(dpkg-query -W -f '${Version}' "$(manifest .dcgm.package)" | sed 's/^[0-9]*://')" "$(manifest .dcgm.version)"
fi
if [ "$GPUFLEET_CLOUD" = tencent ]; then
  grep -q "Open Kernel Module" /proc/driver/nvidia/version && [ "$(manifest .tencent_base.kernel_module)" = proprietary ] &&
    die "the loaded NVIDIA module is the open one; Tencent images carry the proprietary module (V100)"
  apt-mark showhold | grep -qx "nvidia-driver-$branch" || die "the driver is not held"
  record nccl_transport "socket (no RDMA fabric)"
elif [ "$GPUFLEET_CLOUD" = aws ]; then
  grep -q "Open Kernel Module" /proc/driver/nvidia/version || die "the loaded NVIDIA module is not the open kernel module"
  check efa_installer "$(sed -n 's/.*EFA installer version: \([0-9.]*\).*/\1/p' /opt/amazon/efa_installed_packages)" "$(manifest .efa_installer.version)"
  check aws_ofi_nccl "$(cat "$(manifest .aws_ofi_nccl.prefix)/VERSION")" "$(manifest .aws_ofi_nccl.version)"
  check cloudwatch_agent "$(dpkg-query -W -f '${Version}' amazon-cloudwatch-agent)" "$(manifest .cloudwatch_agent.version)"
  # The stacks' EFS mounts (cloud-init, type efs: tls,iam,accesspoint) need mount.efs, its efs-proxy and stunnel.
  for helper in /sbin/mount.efs /usr/bin/efs-proxy /usr/bin/stunnel; do
    [ -x "$helper" ] || die "$helper is missing: the EFS mounts of the stacks need it (32-efs-utils.sh)"
  done
  check efs_utils "$(/sbin/mount.efs --version | awk '{print $NF}')" "$(manifest .efs_utils.version)"
  check efs_utils_package "$(dpkg-query -W -f '${Version}' "$(manifest .efs_utils.package)")" \
    "$(manifest .efs_utils.version)-$(manifest .efs_utils.release)"
  record stunnel "$(dpkg-query -W -f '${Version}' stunnel4)"
  /opt/amazon/efa/bin/fi_info --version >/dev/null || die "fi_info does not run"
  # The efa provider only lists when an EFA interface is attached (EFA-capable build instance).
  efa_present=no
  for driver_link in /sys/class/infiniband/*/device/driver; do
    [ "$(basename "$(readlink -f "$driver_link")")" = efa ] && efa_present=yes
  done
  if [ "$efa_present" = yes ]; then
    /opt/amazon/efa/bin/fi_info -p efa -t FI_EP_RDM >/dev/null || die "fi_info -p efa finds no EFA endpoint"
    record efa_device present
  else
    record efa_device "absent on the build instance (libfabric checked, provider not probed)"
  fi
  apt-mark showhold | grep -qx "nvidia-driver-$branch-open" || die "the driver is not held"
else
  # The stack's Azure Files NFS 4.1 mounts (cloud-init, type aznfs) go through mount.aznfs and its stunnel (TLS), kept
  # up by aznfswatchdogv4; the pinned version stays, its self-update off; stunnel checks Azure Files' certificate
  # against DigiCert Global Root G2, which must be in the image (the helper would fetch it unverified).
  for helper in /sbin/mount.aznfs /usr/bin/stunnel "$(manifest .aznfs.ca_file)"; do
    [ -e "$helper" ] || die "$helper is missing: the Azure Files mounts of the stack need it (34-aznfs.sh)"
  done
  check aznfs "$(dpkg-query -W -f '${Version}' "$(manifest .aznfs.package)")" "$(manifest .aznfs.version)"
  apt-mark showhold | grep -qx "$(manifest .aznfs.package)" || die "aznfs is not held"
  grep -qx "AUTO_UPDATE_AZNFS=false" "$(manifest .aznfs.config)" || die "aznfs updates itself ($(manifest .aznfs.config))"
  systemctl is-enabled --quiet aznfswatchdogv4.service || die "aznfswatchdogv4.service is not enabled"
  ! systemctl is-enabled --quiet aznfswatchdog.service || die "aznfswatchdog.service (its self-update) is enabled"
  record stunnel "$(dpkg-query -W -f '${Version}' stunnel4)"
  record nvidia_driver "$driver (Ubuntu-HPC base image)"
  record cuda "$(nvidia-smi | sed -n 's/.*CUDA Version: \([0-9.]*\).*/\1/p')"
  record docker "$(docker version --format '{{.Server.Version}}')"
  record nvidia_container_toolkit "$toolkit"
  if command -v ibv_devinfo >/dev/null; then record infiniband "$(ibv_devinfo -l | tail -n +2 | xargs)"; fi
fi
dcgmi discovery -l >/dev/null || die "dcgmi cannot reach the DCGM host engine"
apt-mark showhold | grep -q '^linux-image-' || die "the kernel is not held"

[ "$failures" -eq 0 ] || die "$failures component(s) differ from the manifest"
jq --argjson seen "$observed" --arg gpus "$gpus" '{manifest: ., observed: ($seen + {build_gpus: $gpus})}' \
  "$GPUFLEET_MANIFEST" >/etc/gpufleet/image-versions.json
log "image validated: $gpus GPU(s), driver $driver"
