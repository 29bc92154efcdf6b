#!/usr/bin/env bash
# Builds the Debian package of Weir from a staged tree with dpkg-deb (no packaging tool to
# compile): /usr/bin/weir, /etc/weir/routes.toml (a conffile: an upgrade keeps your edits), the
# systemd unit of deploy/weir.service (run as the `weir` system user the package creates), docs.
#
#   bash deploy/debian/build-deb.sh [BINARY] [OUT_DIR]     # prints the path of the .deb
#
# BINARY defaults to target/release/weir (`cargo build --release --locked --bin weir`); it is
# stripped in the staged copy. WEIR_DEB_COMPRESS: dpkg-deb's compressor (xz; gzip is quicker, for
# tests). Needs dpkg-deb, objdump and strip (dpkg, binutils).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
binary="${1:-$repo/target/release/weir}"
out="${2:-$repo/target/debian}"
[ -x "$binary" ] || { echo "build-deb: no executable at $binary (cargo build --release --locked --bin weir)" >&2; exit 1; }

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n1)"
arch="$(dpkg --print-architecture)"
# The newest glibc symbol version the binary links against is the libc6 it needs.
glibc="$(objdump -T "$binary" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)"
[ -n "$glibc" ] || { echo "build-deb: $binary links no glibc symbol: not a Linux glibc binary?" >&2; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
root="$stage/weir_${version}_$arch"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/etc/weir" "$root/lib/systemd/system" \
  "$root/usr/share/doc/weir" "$root/usr/share/weir"
install -m 0755 "$binary" "$root/usr/bin/weir"
strip --strip-unneeded "$root/usr/bin/weir"
install -m 0644 "$repo/conf/routes.toml" "$root/etc/weir/routes.toml"
# The unit of deploy/, with the packaged binary's path and the package's user instead of a
# dynamic one (so /etc/weir can be readable by the service and no one else).
{
  echo "# Installed by the weir Debian package from deploy/weir.service (see /usr/share/doc/weir/README.md)."
  # Its leading comment block (how to install by hand) does not apply to the package.
  awk 'body || !/^#/ { body = 1; print }' "$repo/deploy/weir.service" \
    | sed -e 's#/usr/local/bin/weir#/usr/bin/weir#g' -e 's#^DynamicUser=yes$#User=weir\nGroup=weir#'
} >"$root/lib/systemd/system/weir.service"
grep -q '^User=weir$' "$root/lib/systemd/system/weir.service" \
  || { echo "build-deb: deploy/weir.service no longer has DynamicUser=yes to replace" >&2; exit 1; }
# The config's JSON Schema, for editors (docs/production.md#the-config-schema).
install -m 0644 "$repo/docs/weir.schema.json" "$root/usr/share/weir/weir.schema.json"
install -m 0644 "$repo/deploy/debian/README.md" "$root/usr/share/doc/weir/README.md"
install -m 0644 "$repo/deploy/debian/copyright" "$root/usr/share/doc/weir/copyright"
for script in postinst prerm postrm; do
  install -m 0755 "$repo/deploy/debian/$script" "$root/DEBIAN/$script"
done
echo /etc/weir/routes.toml >"$root/DEBIAN/conffiles"
cat >"$root/DEBIAN/control" <<CONTROL
Package: weir
Version: $version
Architecture: $arch
Maintainer: Weir developers <weir@localhost>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6 (>= $glibc), libgcc-s1, passwd
Section: net
Priority: optional
Description: rate-limiting reverse proxy sidecar
 Weir puts nginx limit_req semantics in front of an API, shared by a fleet of
 proxies through Redis (or kept in memory for one instance). The package
 installs the binary, the example config as /etc/weir/routes.toml and a
 systemd unit that checks the config before it starts and reloads on SIGHUP.
CONTROL

mkdir -p "$out"
deb="$out/weir_${version}_$arch.deb"
dpkg-deb --root-owner-group -Z"${WEIR_DEB_COMPRESS:-xz}" --build "$root" "$deb" >/dev/null
echo "$deb"
