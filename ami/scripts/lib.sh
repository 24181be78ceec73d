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

# verify_signature FILE SIG_URL KEY_URL FINGERPRINT: FILE's detached GPG signature (fetched from SIG_URL) verifies
# with the key at KEY_URL, whose primary fingerprint is FINGERPRINT (the manifest's pin), in a keyring of its own.
verify_signature() {
  local file="$1" sig_url="$2" key_url="$3" fingerprint="$4" gnupg seen
  gnupg="$(mktemp -d)"
  curl -fsSL --retry 3 --proto '=https' -o "$gnupg/key" "$key_url"
  curl -fsSL --retry 3 --proto '=https' -o "$file.sig" "$sig_url"
  GNUPGHOME="$gnupg" gpg --batch --quiet --import "$gnupg/key"
  seen="$(GNUPGHOME="$gnupg" gpg --batch --with-colons --fingerprint | awk -F: '$1 == "fpr" {print $10; exit}')"
  if [ "$seen" != "$fingerprint" ]; then
    rm -rf "$gnupg" "$file.sig"
    die "signing key of $file is $seen, not the pinned $fingerprint"
  fi
  if ! GNUPGHOME="$gnupg" gpg --batch --verify "$file.sig" "$file"; then
    rm -rf "$gnupg" "$file.sig"
    die "the signature of $file does not verify"
  fi
  rm -rf "$gnupg" "$file.sig"
}

# apt_source NAME URI SUITE COMPONENT KEY_URL FINGERPRINT: the apt repository at URI (SUITE, COMPONENT), trusted for
# that repository alone (signed-by) and only with the key at KEY_URL when that file holds exactly one key, whose
# primary fingerprint is FINGERPRINT (the manifest's pin); apt then checks the repository's Release signature and
# every package's hash against it. Another entry for URI (a base image's, with another Signed-By, which apt refuses
# beside this one) is set aside as FILE.gpufleet-replaced, so the pinned key is the repository's only trust.
apt_source() {
  local name="$1" uri="$2" suite="$3" component="$4" key_url="$5" fingerprint="$6" gnupg seen file pattern
  local keyring="/usr/share/keyrings/gpufleet-$name.gpg" list="/etc/apt/sources.list.d/gpufleet-$name.list"
  gnupg="$(mktemp -d)"
  curl -fsSL --retry 3 --proto '=https,file' -o "$gnupg/key" "$key_url"
  GNUPGHOME="$gnupg" gpg --batch --quiet --import "$gnupg/key" 2>/dev/null || true
  seen="$(GNUPGHOME="$gnupg" gpg --batch --with-colons --fingerprint 2>/dev/null |
    awk -F: '$1 == "pub" {primary = 1; next} primary && $1 == "fpr" {print $10; primary = 0}' | paste -sd' ')"
  if [ "$seen" != "$fingerprint" ]; then
    rm -rf "$gnupg"
    die "the key at $key_url is '${seen}', not exactly the pinned $fingerprint"
  fi
  install -d -m 0755 "$(dirname "$keyring")" "$(dirname "$list")"
  GNUPGHOME="$gnupg" gpg --batch --export "$fingerprint" >"$keyring.part"
  rm -rf "$gnupg"
  chmod 0644 "$keyring.part"
  mv "$keyring.part" "$keyring"
  pattern="(^|[[:space:]])${uri//./\\.}/?([[:space:]]|$)"
  for file in "$(dirname "$list")"/*.list "$(dirname "$list")"/*.sources; do
    if [ ! -f "$file" ] || [ "$file" = "$list" ]; then continue; fi
    if grep -v '^[[:space:]]*#' "$file" | grep -qE "$pattern"; then
      mv "$file" "$file.gpufleet-replaced"
      log "set aside $file (another entry for $uri): $list replaces it"
    fi
  done
  printf 'deb [signed-by=%s] %s %s %s\n' "$keyring" "$uri" "$suite" "$component" >"$list"
}

# account NAME UID GID HOME: the system user and group NAME with fixed ids (the same on every machine: jobs and
# munge credentials carry uids, the shared file system stores them); an existing one with other ids is an error.
account() {
  local name="$1" uid="$2" gid="$3" home="$4" found
  if getent group "$name" >/dev/null; then
    found="$(getent group "$name" | cut -d: -f3)"
    [ "$found" = "$gid" ] || die "group $name exists with gid $found, not $gid"
  else
    groupadd --system --gid "$gid" "$name"
  fi
  if getent passwd "$name" >/dev/null; then
    found="$(id -u "$name")"
    [ "$found" = "$uid" ] || die "user $name exists with uid $found, not $uid"
  else
    useradd --system --uid "$uid" --gid "$gid" --home-dir "$home" --no-create-home --shell /usr/sbin/nologin "$name"
  fi
}
