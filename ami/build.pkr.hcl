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

  # The scripts in three phases, the build machine rebooted between them (into the kernel and driver just
  # installed); the phase after a reboot waits for the machine to be back.
  dynamic "provisioner" {
    for_each = [local.steps_before_reboot, ["reboot"], local.steps, ["reboot"], local.steps_after_reboot]
    labels   = ["shell"]
    content {
      pause_before      = provisioner.key > 0 && provisioner.value != ["reboot"] ? "30s" : "0s"
      environment_vars  = ["GPUFLEET_CLOUD=${local.cloud[source.type]}", "GPUFLEET_MANIFEST=/tmp/gpufleet-ami/versions.json"]
      execute_command   = "chmod +x {{ .Path }}; {{ .Vars }} sudo -E {{ .Path }}"
      inline            = [for s in provisioner.value : s == "reboot" ? "systemctl reboot" : "bash /tmp/gpufleet-ami/scripts/${s}"]
      expect_disconnect = provisioner.value == ["reboot"]
    }
  }

  provisioner "shell" {
    execute_command = "chmod +x {{ .Path }}; sudo {{ .Path }}"
    inline          = ["rm -rf /tmp/gpufleet-ami", "apt-get clean", "cloud-init clean --logs"]
  }

  # Azure images must be generalized by the agent before capture.
  provisioner "shell" {
    only            = ["azure-arm.gpu"]
    execute_command = "chmod +x {{ .Path }}; {{ .Vars }} sudo -E sh '{{ .Path }}'"
    inline          = ["/usr/sbin/waagent -force -deprovision+user && export HISTSIZE=0 && sync"]
  }
}
