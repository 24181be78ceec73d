#!/usr/bin/env bash
# Slurm's TaskProlog on a GPU node (slurm.conf TaskProlog, installed as /usr/local/sbin/gpufleet-task-prolog):
# slurmstepd runs it as the job's user before each task, the batch script's included, and sets in the task what it
# prints as `export NAME=value` (and removes what it prints as `unset NAME`). It hands every task the node's NCCL/EFA
# settings (/etc/gpufleet/nccl.env, written at bake time by 60-nccl-env.sh), whatever submitted the job: the bridge,
# or a user's own sbatch script. The task's LD_LIBRARY_PATH is kept after the node's library directories.
# Where the job has credentials of its own (the Prolog wrote its token file, the job's,
# 0400, in a directory only root writes), every task gets them the way AWS hands them to containers: the standard
# AWS_CONTAINER_CREDENTIALS_FULL_URI (the node's loopback endpoint, gpufleet-credentials.service) and
# AWS_CONTAINER_AUTHORIZATION_TOKEN, which every AWS SDK reads (on Tencent: the trainer's provider, and boto3
# against COS's S3 API), with the variables that would win over them unset (AWS's and Tencent's static keys).
# On an Azure node (node.json's cloud) the same token reaches the endpoint the way App Service hands a managed identity
# to its code, which azure-identity reads: IDENTITY_ENDPOINT (the endpoint's /msi/token) and IDENTITY_HEADER, with
# the variables that would win over them unset (a service principal's secret, other managed-identity hosts').
# A token file that is a link, or holds anything but a token, is ignored.
set -euo pipefail
LC_ALL=C  # the patterns below are ASCII's

# Slurm passes no argument; tests pass their own.
settings="${1:-/etc/gpufleet/nccl.env}"
credentials="${2:-/run/gpufleet/credentials}"
endpoint="${3:-http://127.0.0.1:51680/v1/credentials}"
node_json="${4:-/etc/gpufleet/node.json}"

if [ -r "$settings" ]; then
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
      '' | '#'*) continue ;;
    esac
    name="${line%%=*}"
    value="${line#*=}"
    case "$name" in
      *[!A-Za-z0-9_]* | '' | [0-9]*) continue ;;
    esac
    if [ "$name" = LD_LIBRARY_PATH ] && [ -n "${LD_LIBRARY_PATH:-}" ]; then
      value="$value:$LD_LIBRARY_PATH"
    fi
    printf 'export %s=%s\n' "$name" "$value"
  done <"$settings"
fi

job="${SLURM_JOB_ID:-}"
[[ "$job" =~ ^[0-9]+$ ]] || exit 0
token_file="$credentials/tokens/$job"
if [ -L "$token_file" ] || [ ! -f "$token_file" ] || [ ! -r "$token_file" ]; then
  exit 0
fi
token="$(head -c 256 -- "$token_file")"
[[ "$token" =~ ^[0-9]+\.[A-Za-z0-9_-]{43}$ ]] || exit 0
cloud=""
if [ -r "$node_json" ] && [ ! -L "$node_json" ]; then
  cloud="$(jq -r '.cloud // empty' -- "$node_json" 2>/dev/null)" || cloud=""
fi
if [ "$cloud" = azure ]; then
  for name in AZURE_CLIENT_SECRET AZURE_CLIENT_CERTIFICATE_PATH AZURE_USERNAME AZURE_PASSWORD \
    AZURE_FEDERATED_TOKEN_FILE IDENTITY_SERVER_THUMBPRINT IMDS_ENDPOINT MSI_ENDPOINT MSI_SECRET; do
    printf 'unset %s\n' "$name"
  done
  printf 'export IDENTITY_ENDPOINT=%s\n' "${endpoint%/v1/credentials}/msi/token"
  printf 'export IDENTITY_HEADER=%s\n' "$token"
  exit 0
fi
for name in AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_PROFILE \
  AWS_CONTAINER_CREDENTIALS_RELATIVE_URI TENCENTCLOUD_SECRET_ID TENCENTCLOUD_SECRET_KEY TENCENTCLOUD_SESSION_TOKEN; do
  printf 'unset %s\n' "$name"
done
printf 'export AWS_CONTAINER_CREDENTIALS_FULL_URI=%s\n' "$endpoint"
printf 'export AWS_CONTAINER_AUTHORIZATION_TOKEN=%s\n' "$token"
