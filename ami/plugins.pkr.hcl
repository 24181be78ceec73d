# Plugin requirements for `packer init` (Packer >= 1.7). Kept apart so the other files also validate
# with Packer builds that bundle their builders (Debian's packer 1.6.6 rejects this block).
packer {
  required_version = ">= 1.10.0"
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = ">= 1.3.0"
    }
    azure = {
      source  = "github.com/hashicorp/azure"
      version = ">= 2.1.0"
    }
    tencentcloud = {
      source  = "github.com/hashicorp/tencentcloud"
      version = ">= 1.2.0"
    }
  }
}
