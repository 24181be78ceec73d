#!/usr/bin/env bash
# amazon-efs-utils: mount.efs, the helper behind the AWS stacks' cloud-init mounts of type efs on the controller and
# every node (_netdev,tls,iam,accesspoint=...): TLS through its efs-proxy (stunnel, from Ubuntu's archive, is the
# package's declared dependency and fallback), IAM authorization with the instance profile. AWS publishes no .deb for
# Ubuntu: built as upstream's INSTALL.md documents (./build-deb.sh) from the verified release archive, with the Rust
# and Go toolchains the manifest pins (verified downloads, used from a scratch folder and removed with it). AWS only.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if [ "$GPUFLEET_CLOUD" != aws ]; then
  log "efs-utils: not on $GPUFLEET_CLOUD (EFS is AWS's file system)"
  exit 0
fi
version="$(manifest .efs_utils.version)"
package="$(manifest .efs_utils.package)"
deb_version="$version-$(manifest .efs_utils.release)"
if [ "$(dpkg-query -W -f '${Version}' "$package" 2>/dev/null)" = "$deb_version" ]; then
  log "efs-utils $version already installed"
  exit 0
fi

# What the package depends on, from Ubuntu's archive; then the build packages upstream's INSTALL.md lists for
# Debian/Ubuntu (its rustc and cargo replaced by the pinned toolchain below: CMake, Perl and a C/C++ compiler build
# AWS-LC's FIPS module, envsubst and ar the .deb, git reads the archive's commit), xz for the Rust archive, and
# libclang for bindgen where a crate ships no bindings for this target.
apt_install stunnel4 nfs-common openssl
apt_install git binutils gettext-base pkg-config libssl-dev cmake perl make gcc g++ xz-utils libclang-dev

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Every download is checked before anything is unpacked or run.
fetch_component efs_utils "$work/efs-utils.tar.gz"
gzip -dc "$work/efs-utils.tar.gz" >"$work/efs-utils.tar"
commit="$(git get-tar-commit-id <"$work/efs-utils.tar" || true)"
[ "$commit" = "$(manifest .efs_utils.commit)" ] ||
  die "the efs-utils archive is commit '${commit}', not the release's $(manifest .efs_utils.commit)"
fetch_component efs_utils.rust "$work/rust.tar.xz"
verify_signature "$work/rust.tar.xz" "$(manifest .efs_utils.rust.sig_url)" "$(manifest .efs_utils.rust.gpg_key_url)" \
  "$(manifest .efs_utils.rust.gpg_fingerprint)"
fetch_component efs_utils.go "$work/go.tar.gz"

install -d "$work/rust-installer" "$work/src"
tar -xJf "$work/rust.tar.xz" -C "$work/rust-installer" --strip-components 1
"$work/rust-installer/install.sh" --prefix="$work/rust" >/dev/null
tar -xzf "$work/go.tar.gz" -C "$work"
tar -xf "$work/efs-utils.tar" -C "$work/src" --strip-components 1

(
  # The pinned toolchains and nothing else: their caches in the scratch folder, and Go never fetches another toolchain.
  export PATH="$work/rust/bin:$work/go/bin:$PATH" CARGO_HOME="$work/cargo" GOPATH="$work/gopath" \
    GOCACHE="$work/gocache" GOTOOLCHAIN=local
  [ "$(rustc --version | awk '{print $2}')" = "$(manifest .efs_utils.rust.version)" ] || die "rustc is not the pinned one"
  [ "$(go env GOVERSION)" = "go$(manifest .efs_utils.go.version)" ] || die "go is not the pinned one"
  cd "$work/src"
  # Exactly the crates of the release's Cargo.lock (cargo checks each against the checksum there); then offline.
  cargo fetch --locked --manifest-path src/proxy/Cargo.toml
  CARGO_NET_OFFLINE=true ./build-deb.sh
)
deb="$work/src/build/${package}-${deb_version}_$(dpkg --print-architecture).deb"
[ -f "$deb" ] || die "build-deb.sh made no $deb"
apt_install "$deb"

installed="$(dpkg-query -W -f '${Version}' "$package")"
[ "$installed" = "$deb_version" ] || die "$package is $installed, the manifest pins $deb_version"
[ "$(/sbin/mount.efs --version | awk '{print $NF}')" = "$version" ] || die "/sbin/mount.efs is not $version"
log "efs-utils $version installed (mount.efs, efs-proxy); stunnel4 $(dpkg-query -W -f '${Version}' stunnel4) from the archive"
