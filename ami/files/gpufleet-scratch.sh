#!/usr/bin/env bash
# Assemble the instance's local NVMe disks (instance store) at /mnt/scratch: RAID0 over several disks,
# one disk as it is, none: a directory on the root disk. /mnt/scratch/data-cache is bind-mounted at
# /var/cache/gpufleet/data. Idempotent across reboots (the array and file system are found by label).
# Usage: gpufleet-scratch [--plan]   --plan reads `lsblk --json -o NAME,TYPE,MODEL,MOUNTPOINT` output on
# stdin and prints the commands a first boot would run, running none.
set -euo pipefail

MOUNT=/mnt/scratch
CACHE=/var/cache/gpufleet/data
LABEL=gpufleet-scratch
ARRAY=/dev/md/gpufleet-scratch
plan=0
[ "${1:-}" = --plan ] && plan=1

run() {
  if [ "$plan" = 1 ]; then echo "$*"; else "$@"; fi
}

# Whole, unused instance-store disks: AWS "Amazon EC2 NVMe Instance Storage", Azure "Microsoft NVMe Direct Disk".
local_disks() {
  jq -r '.blockdevices[]
    | select(.type == "disk" and (.model // "" | test("Instance Storage|NVMe Direct Disk")))
    | select(.children == null and .mountpoint == null)
    | "/dev/" + .name'
}

if [ "$plan" = 0 ]; then
  if mountpoint -q "$MOUNT"; then
    echo "gpufleet-scratch: $MOUNT already mounted"
    exit 0
  fi
  device="$(blkid -L "$LABEL" || true)"
  mapfile -t disks < <(lsblk --json -o NAME,TYPE,MODEL,MOUNTPOINT | local_disks)
else
  device=""
  mapfile -t disks < <(local_disks)
fi

if [ -z "$device" ]; then
  case "${#disks[@]}" in
    0)
      echo "gpufleet-scratch: no local NVMe disk; $MOUNT stays on the root disk"
      ;;
    1)
      device="${disks[0]}"
      run mkfs.xfs -f -L "$LABEL" "$device"
      ;;
    *)
      device="$ARRAY"
      run mdadm --create "$ARRAY" --run --level=0 --raid-devices="${#disks[@]}" "${disks[@]}"
      run mkfs.xfs -f -L "$LABEL" "$device"
      ;;
  esac
fi

run mkdir -p "$MOUNT"
[ -n "$device" ] && run mount -o noatime "$device" "$MOUNT"
run mkdir -p "$MOUNT/data-cache" "$MOUNT/tmp" "$MOUNT/jobs" "$CACHE"
run chmod 1777 "$MOUNT/tmp"
# Each job attempt makes its own 0700 directory here (trainer.node.runner.job_scratch): writable and sticky but
# not listable, so no job lists, enters or removes another's.
run chmod 1733 "$MOUNT/jobs"
run chown gpufleet:gpufleet "$MOUNT/data-cache"
run mount --bind "$MOUNT/data-cache" "$CACHE"
