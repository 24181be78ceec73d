#!/usr/bin/env bash
# Amazon CloudWatch agent with GPU metrics (nvidia_gpu). The stack's namespace and log group are set at
# boot from node.json by gpufleet-node-config; the baked config carries everything else.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if [ "$GPUFLEET_CLOUD" != aws ]; then
  log "cloudwatch agent: not on $GPUFLEET_CLOUD (Azure Monitor's and Tencent Cloud Monitor's agents come with the nodes)"
  exit 0
fi
version="$(manifest .cloudwatch_agent.version)"
if [[ "$(dpkg-query -W -f '${Version}' amazon-cloudwatch-agent 2>/dev/null)" != "$version"* ]]; then
  fetch_component cloudwatch_agent /tmp/amazon-cloudwatch-agent.deb
  dpkg -i /tmp/amazon-cloudwatch-agent.deb
  rm -f /tmp/amazon-cloudwatch-agent.deb
fi
hold amazon-cloudwatch-agent
install -D -m 0644 /tmp/gpufleet-ami/files/cloudwatch-agent.json /etc/gpufleet/cloudwatch-agent.json
log "cloudwatch agent $version installed; config template /etc/gpufleet/cloudwatch-agent.json"
