# shellcheck shell=bash
# Shared helpers for the provisioning scripts: manifest lookups, verified downloads, pinned apt installs.
# Sourced, never executed. The manifest (versions.json) is the one source of versions.

GPUFLEET_MANIFEST="${GPUFLEET_MANIFEST:-/tmp/gpufleet-ami/versions.json}"
GPUFLEET_CLOUD="${GPUFLEET_CLOUD:-aws}"
export DEBIAN_FRONTEND=noninteractive

log() { printf '[gpufleet-ami] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# manifest JQ_PATH: the value at JQ_PATH in the manifest; fails when it is missing or null.
manifest() {
  jq -er "$1 // error(\"missing in manifest: $1\")" "$GPUFLEET_MANIFEST"
}

# ships_with_base COMPONENT: true when the Azure HPC base image already provides COMPONENT.
ships_with_base() {
  [ "$GPUFLEET_CLOUD" = azure ] &&
    jq -e --arg c "$1" '.azure_hpc_base.ships | index($c) != null' "$GPUFLEET_MANIFEST" >/dev/null
}

# fetch_verified URL SHA256 DEST: download URL to DEST and check its sha256.
# Refuses when SHA256 is absent (null/empty) or not 64 hex characters: nothing unverified is installed.
fetch_verified() {
  local url="$1" sha="$2" dest="$3"
  if ! [[ "$sha" =~ ^[0-9a-f]{64}$ ]]; then
    die "no sha256 for $url in the manifest (got '${sha}'); fill it from the vendor-published value before baking"
  fi
  curl -fsSL --retry 3 --proto '=https,file' -o "$dest.part" "$url"
  if ! printf '%s  %s\n' "$sha" "$dest.part" | sha256sum --check --status; then
    rm -f "$dest.part"
    die "sha256 mismatch for $url"
  fi
  mv "$dest.part" "$dest"
}

# fetch_component NAME DEST: fetch_verified with the url and sha256 the manifest gives for .NAME.
fetch_component() {
  fetch_verified "$(manifest ".$1.url")" "$(jq -r ".$1.sha256 // \"\"" "$GPUFLEET_MANIFEST")" "$2"
}

# apt_pin NAME VERSION_GLOB PACKAGE...: prefer VERSION_GLOB of PACKAGEs over any other candidate.
apt_pin() {
  local name="$1" glob="$2"
  shift 2
  printf 'Package: %s\nPin: version %s\nPin-Priority: 1001\n' "$*" "$glob" \
    >"/etc/apt/preferences.d/gpufleet-$name"
}

apt_install() {
  apt-get install -y -q --no-install-recommends "$@"
}

# hold PACKAGE...: keep unattended upgrades from moving the package.
hold() {
  apt-mark hold "$@" >/dev/null
}
