# AWS: an encrypted EBS-backed AMI from Canonical's Ubuntu, built and validated on a GPU instance.

variable "aws_region" {
  type    = string
  default = "eu-west-1"
}

variable "aws_build_instance_type" {
  type        = string
  description = "GPU instance type of the build machine: the validation step runs nvidia-smi on it."
  default     = "g6.xlarge"
  validation {
    condition     = contains(["g4dn", "g5", "g6", "g6e", "gr6", "p4d", "p4de", "p5", "p5e", "p5en"], split(".", var.aws_build_instance_type)[0])
    error_message = "The aws_build_instance_type must be an NVIDIA GPU type (g4dn, g5, g6, g6e, p4d, p5, ...)."
  }
}

variable "aws_subnet_id" {
  type        = string
  description = "Subnet for the build machine; empty: the default VPC."
  default     = ""
}

variable "aws_kms_key_id" {
  type        = string
  description = "KMS key for the AMI's snapshots; empty: the account's default EBS key."
  default     = ""
}

variable "aws_copy_regions" {
  type    = list(string)
  default = []
}

variable "root_volume_iops" {
  type    = number
  default = 3000
  validation {
    condition     = var.root_volume_iops >= 3000 && var.root_volume_iops <= 16000
    error_message = "The root_volume_iops must be between 3000 and 16000 (gp3)."
  }
}

variable "root_volume_throughput" {
  type    = number
  default = 250
  validation {
    condition     = var.root_volume_throughput >= 125 && var.root_volume_throughput <= 1000
    error_message = "The root_volume_throughput must be between 125 and 1000 MiB/s (gp3)."
  }
}

source "amazon-ebs" "gpu" {
  region          = var.aws_region
  instance_type   = var.aws_build_instance_type
  subnet_id       = var.aws_subnet_id
  ssh_username    = "ubuntu"
  ami_name        = local.image_name
  ami_description = "gpufleet GPU node ${local.v.image_version}: NVIDIA ${local.v.nvidia_driver.version}, CUDA ${local.v.cuda.version}, EFA ${local.v.efa_installer.version}, Slurm ${local.v.slurm.version}"
  ami_regions     = var.aws_copy_regions
  ena_support     = true
  encrypt_boot    = true
  kms_key_id      = var.aws_kms_key_id

  source_ami_filter {
    filters = {
      name                = "ubuntu/images/hvm-ssd*/ubuntu-${local.v.ubuntu.codename}-${local.v.ubuntu.release}-amd64-server-*"
      architecture        = "x86_64"
      root-device-type    = "ebs"
      virtualization-type = "hvm"
    }
    owners      = ["099720109477"] # Canonical
    most_recent = true
  }

  launch_block_device_mappings {
    device_name           = "/dev/sda1"
    volume_size           = var.root_volume_gb
    volume_type           = "gp3"
    iops                  = var.root_volume_iops
    throughput            = var.root_volume_throughput
    encrypted             = true
    kms_key_id            = var.aws_kms_key_id
    delete_on_termination = true
  }

  # IMDSv2 only on the build machine, and as the default of every instance launched from the AMI.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }
  imds_support = "v2.0"

  tags          = local.image_tags
  snapshot_tags = local.image_tags
  run_tags      = { Name = "packer-${local.image_name}" }
}
