#!/usr/bin/env bash
# make tools: install the programs the tests and the demo run, skipping every one already present.
#   Debian packages (apt-get, as root): packer (validate only; bakes need HashiCorp's >= 1.10), shellcheck,
#   cloud-init, jq, curl, systemd (systemd-analyze), docker.io, npm; Azurite from npm into node_modules/.
# Nothing missing: prints nothing, exits 0. Cannot install: one line on stderr, exit 2.
# Uses bash builtins only until it installs, so it runs (and says why it cannot) on a bare PATH too.
set -euo pipefail
cd "${BASH_SOURCE[0]%/*}/.."

# command that shows the tool is present : Debian package that installs it
DEBIAN=(packer:packer shellcheck:shellcheck cloud-init:cloud-init jq:jq curl:curl
        systemd-analyze:systemd docker:docker.io npm:npm)
AZURITE=node_modules/.bin/azurite
LOG="${TMPDIR:-/tmp}/gpufleet-tools.log"

fail() {
  echo "make tools: $*" >&2
  exit 2
}

packages=()
for entry in "${DEBIAN[@]}"; do
  command -v "${entry%%:*}" >/dev/null || packages+=("${entry#*:}")
done

if [ ${#packages[@]} -gt 0 ]; then
  [ "$EUID" -eq 0 ] || fail "cannot install ${packages[*]}: not root (run it as root, or install these Debian packages)"
  command -v apt-get >/dev/null || fail "cannot install ${packages[*]}: no apt-get (install these Debian packages)"
  echo "make tools: installing ${packages[*]} (log: $LOG)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "${packages[@]}"; } >"$LOG" 2>&1 \
    || fail "apt-get could not install ${packages[*]} (see $LOG)"
fi

if [ ! -x "$AZURITE" ]; then
  echo "make tools: installing Azurite into node_modules (log: $LOG)"
  npm install --no-audit --no-fund >"$LOG" 2>&1 || fail "npm could not install Azurite (see $LOG)"
  [ -x "$AZURITE" ] || fail "npm install did not provide $AZURITE (see $LOG)"
fi
