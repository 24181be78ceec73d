#!/usr/bin/env bash
# Boot-time settings from /etc/gpufleet/node.json (a GPU node) or controller.json (the controller), both written by
# user-data: points the CloudWatch agent at the stack's metric namespace and log group and starts it. Runs before
# the machine joins the Slurm cluster (gpufleet-node.service, gpufleet-controller.service).
set -euo pipefail

node_json="${1:-/etc/gpufleet/node.json}"
[ -r "$node_json" ] || { echo "gpufleet-node-config: $node_json is missing" >&2; exit 1; }
cloud="$(jq -er .cloud "$node_json")"

if [ "$cloud" = aws ]; then
  config=/opt/aws/amazon-cloudwatch-agent/etc/gpufleet.json
  jq --arg ns "$(jq -er .metric_namespace "$node_json")" --arg lg "$(jq -er .log_group "$node_json")" \
    '.metrics.namespace = $ns | .logs.logs_collected.files.collect_list[].log_group_name = $lg' \
    /etc/gpufleet/cloudwatch-agent.json >"$config.tmp"
  mv "$config.tmp" "$config"
  /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s -c "file:$config"
fi
