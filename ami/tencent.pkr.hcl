# Tencent Cloud: a custom image from Tencent's public Ubuntu image, built and validated on a GPU CVM, shared
# to the regions the stacks use. The build machine gets a public IP for the downloads; cluster nodes get none.

variable "tencent_region" {
  type    = string
  default = "ap-shanghai"
}

variable "tencent_zone" {
  type    = string
  default = "ap-shanghai-4"
}

variable "tencent_build_instance_type" {
  type        = string
  description = "GPU instance type of the build machine: the validation step runs nvidia-smi on it."
  default     = "GN7.2XLARGE32"
  validation {
    condition     = contains(["GN7", "GN10X", "GN10Xp", "GT4", "GN8", "GI3X"], split(".", var.tencent_build_instance_type)[0])
    error_message = "The tencent_build_instance_type must be an NVIDIA GPU type (GN7, GN10Xp, GT4, ...)."
  }
}

variable "tencent_copy_regions" {
  type    = list(string)
  default = []
}

source "tencentcloud-cvm" "gpu" {
  region                      = var.tencent_region
  zone                        = var.tencent_zone
  instance_type               = var.tencent_build_instance_type
  source_image_name           = local.v.tencent_base.image_name
  image_name                  = local.image_name
  image_description           = "gpufleet GPU node ${local.v.image_version}"
  image_copy_regions          = var.tencent_copy_regions
  disk_type                   = "CLOUD_PREMIUM"
  disk_size                   = var.root_volume_gb
  associate_public_ip_address = true
  internet_max_bandwidth_out  = 100
  ssh_username                = "ubuntu"
  force_poweroff              = true
  run_tags                    = local.image_tags
}
