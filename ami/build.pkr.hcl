# One build for the three clouds: upload the manifest, scripts, units and trainer wheel, run one script per
# component (reboots where the kernel or driver changes), validate, then clean up.

build {
  name    = "gpufleet-gpu"
  sources = ["source.amazon-ebs.gpu", "source.azure-arm.gpu", "source.tencentcloud-cvm.gpu"]

  provisioner "shell" {
    inline = ["mkdir -p /tmp/gpufleet-ami"]
  }

  provisioner "file" {
    sources     = ["${path.root}/versions.json", "${path.root}/scripts", "${path.root}/systemd", "${path.root}/files", "${var.trainer_wheel_dir}/${local.v.trainer.wheel}"]
    destination = "/tmp/gpufleet-ami/"
  }

  provisioner "shell" {
    environment_vars = ["GPUFLEET_CLOUD=${local.cloud[source.type]}", "GPUFLEET_MANIFEST=/tmp/gpufleet-ami/versions.json"]
    execute_command  = "chmod +x {{ .Path }}; {{ .Vars }} sudo -E {{ .Path }}"
    inline           = [for s in local.steps_before_reboot : "bash /tmp/gpufleet-ami/scripts/${s}"]
  }

  provisioner "shell" {
    execute_command   = "chmod +x {{ .Path }}; sudo {{ .Path }}"
    inline            = ["systemctl reboot"]
    expect_disconnect = true
  }

  provisioner "shell" {
    pause_before     = "30s"
    environment_vars = ["GPUFLEET_CLOUD=${local.cloud[source.type]}", "GPUFLEET_MANIFEST=/tmp/gpufleet-ami/versions.json"]
    execute_command  = "chmod +x {{ .Path }}; {{ .Vars }} sudo -E {{ .Path }}"
    inline           = [for s in local.steps : "bash /tmp/gpufleet-ami/scripts/${s}"]
  }

  provisioner "shell" {
    execute_command   = "chmod +x {{ .Path }}; sudo {{ .Path }}"
    inline            = ["systemctl reboot"]
    expect_disconnect = true
  }

  provisioner "shell" {
    pause_before     = "30s"
    environment_vars = ["GPUFLEET_CLOUD=${local.cloud[source.type]}", "GPUFLEET_MANIFEST=/tmp/gpufleet-ami/versions.json"]
    execute_command  = "chmod +x {{ .Path }}; {{ .Vars }} sudo -E {{ .Path }}"
    inline = concat([for s in local.steps_after_reboot : "bash /tmp/gpufleet-ami/scripts/${s}"],
    ["rm -rf /tmp/gpufleet-ami", "apt-get clean", "cloud-init clean --logs"])
  }

  # Azure images must be generalized by the agent before capture.
  provisioner "shell" {
    only            = ["azure-arm.gpu"]
    execute_command = "chmod +x {{ .Path }}; {{ .Vars }} sudo -E sh '{{ .Path }}'"
    inline          = ["/usr/sbin/waagent -force -deprovision+user && export HISTSIZE=0 && sync"]
  }
}
