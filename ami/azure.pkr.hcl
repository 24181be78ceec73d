# Azure: a gen2 image from Microsoft's Ubuntu-HPC (driver, CUDA, NCCL, DOCA/MOFED for InfiniBand already in it),
# published as a version of a Shared Image Gallery (Azure Compute Gallery) image definition.

variable "azure_subscription_id" {
  type    = string
  default = ""
}

variable "azure_resource_group" {
  type        = string
  description = "Resource group of the gallery and of the intermediate managed image."
  default     = "gpufleet-images"
}

variable "azure_location" {
  type    = string
  default = "westeurope"
}

variable "azure_gallery" {
  type    = string
  default = "gpufleet"
}

variable "azure_gallery_image" {
  type        = string
  description = "Image definition in the gallery (gen2, Linux, generalized)."
  default     = "gpufleet-gpu"
}

variable "azure_replication_regions" {
  type    = list(string)
  default = ["westeurope"]
}

variable "azure_build_vm_size" {
  type        = string
  description = "GPU VM size of the build machine: the validation step runs nvidia-smi on it."
  default     = "Standard_NC24ads_A100_v4"
  validation {
    condition     = substr(var.azure_build_vm_size, 0, 10) == "Standard_N"
    error_message = "The azure_build_vm_size must be an N-series (GPU) size."
  }
}

variable "azure_base_image_version" {
  type        = string
  description = "Version of the Ubuntu-HPC marketplace image; pin it (az vm image list --all -p microsoft-dsvm -f ubuntu-hpc -s 2204)."
  default     = "latest"
}

source "azure-arm" "gpu" {
  use_azure_cli_auth = true
  subscription_id    = var.azure_subscription_id
  location           = var.azure_location
  vm_size            = var.azure_build_vm_size
  os_type            = "Linux"
  os_disk_size_gb    = var.root_volume_gb

  image_publisher = local.v.azure_hpc_base.publisher
  image_offer     = local.v.azure_hpc_base.offer
  image_sku       = local.v.azure_hpc_base.sku
  image_version   = var.azure_base_image_version

  managed_image_name                = local.image_name
  managed_image_resource_group_name = var.azure_resource_group

  shared_image_gallery_destination {
    subscription        = var.azure_subscription_id
    resource_group      = var.azure_resource_group
    gallery_name        = var.azure_gallery
    image_name          = var.azure_gallery_image
    image_version       = local.v.image_version
    replication_regions = var.azure_replication_regions
  }

  azure_tags = local.azure_image_tags
}

locals {
  # Azure tags the versions this build installs: the HPC base image ships the driver, CUDA, NCCL and the rest
  # (recorded as the base image), and EFA, the CloudWatch agent and efs-utils are AWS's. A managed image takes 15 tags.
  azure_not_installed = concat(local.v.azure_hpc_base.ships, ["efa_installer", "aws_ofi_nccl", "cloudwatch_agent", "efs_utils"])
  azure_image_tags = merge(
    var.tags,
    { for name, component in local.v : "gpufleet:${name}" => component.version if can(component.version) && ! contains(local.azure_not_installed, name) },
    { "gpufleet:image-version" = local.v.image_version, "gpufleet:ubuntu" = local.v.ubuntu.release, Name = local.image_name },
    { "gpufleet:base-image" = "${local.v.azure_hpc_base.offer}:${local.v.azure_hpc_base.sku}:${var.azure_base_image_version}" }
  )
}
