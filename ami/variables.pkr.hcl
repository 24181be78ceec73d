# Inputs shared by the AWS, Azure and Tencent Cloud builds, and the manifest every version comes from.

locals {
  # ONE source of versions: the scripts read the same file on the build machine (jq).
  v          = jsondecode(file("${path.root}/versions.json"))
  stamp      = formatdate("YYYYMMDDhhmm", timestamp())
  image_name = "gpufleet-gpu-${local.v.image_version}-${local.stamp}"
  # Every component of the manifest that has a version is stamped on the image.
  version_tags = merge(
    { for name, component in local.v : "gpufleet:${name}" => component.version if can(component.version) },
    { "gpufleet:image-version" = local.v.image_version, "gpufleet:ubuntu" = local.v.ubuntu.release }
  )
  image_tags = merge(var.tags, local.version_tags, { Name = local.image_name })
  # The cloud each builder bakes for (GPUFLEET_CLOUD of the scripts).
  cloud = { "amazon-ebs" = "aws", "azure-arm" = "azure", "tencentcloud-cvm" = "tencent" }
  # Provisioning order; "reboot" restarts the build machine between steps.
  steps_before_reboot = ["00-base.sh"]
  # A script of one cloud's component skips itself on the others (GPUFLEET_CLOUD): 20-efa.sh, 22-aws-ofi-nccl.sh,
  # 31-cloudwatch-agent.sh and 32-efs-utils.sh install on AWS only, 34-aznfs.sh on Azure only; 33-nfs-common.sh on all.
  steps = ["01-kernel-hold.sh", "10-nvidia-driver.sh", "11-fabric-manager.sh", "12-cuda.sh", "20-efa.sh",
    "21-nccl.sh", "22-aws-ofi-nccl.sh", "30-dcgm.sh", "31-cloudwatch-agent.sh", "32-efs-utils.sh",
  "33-nfs-common.sh", "34-aznfs.sh", "40-docker.sh", "45-slurm.sh", "50-trainer.sh", "60-nccl-env.sh"]
  steps_after_reboot = ["99-validate.sh"]
}

variable "trainer_wheel_dir" {
  type        = string
  description = "Folder holding the trainer wheel built by `pip wheel trainer/ --no-deps -w dist/`."
  default     = "dist"
}

variable "root_volume_gb" {
  type    = number
  default = 200
  validation {
    condition     = var.root_volume_gb >= 100 && var.root_volume_gb <= 16384
    error_message = "The root_volume_gb must be between 100 and 16384 (drivers, CUDA and torch need room)."
  }
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for the image (owner, cost center); the versions are added from the manifest."
  default     = {}
}
