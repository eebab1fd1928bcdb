#!/usr/bin/env bash
# Builds the connector and operator images without a Docker daemon: the release binaries with
# cargo-auditable (each binary carries its crates and their versions, which vulnerability
# scanners read), then for each image a root filesystem holding the binary, exactly the shared libraries
# it loads, CA certificates, /etc/passwd and /etc/group with the nonroot user 65532,
# nsswitch.conf and a dpkg status file per Debian package copied in (what the distroless base of
# the Dockerfile provides), written with umoci as an
# OCI image layout tagged with the crate version. The image configuration (labels, user, ports,
# entrypoint, working directory, volumes) is read from the Dockerfile's final stages
# (images/stage.py), so both builds make the same images.
# Usage: images/build.sh [OUT_DIR]  (default target/images). Needs root (files owned by 0 and
# 65532), umoci (Debian's package) and cargo-auditable (installed here when missing). Prints OUT_DIR; the layouts
# are OUT_DIR/kubemq-amqp-connector and OUT_DIR/kubemq-amqp-operator.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "images/build.sh needs root: its files belong to 0 and 65532" >&2; exit 1; }
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$(realpath -m "${1:-target/images}")
VERSION=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "kubemq-amqp-connector"))')

if ! command -v umoci >/dev/null; then
  echo "== installing umoci (Debian)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q umoci >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q umoci >&2; }
fi

if ! command -v cargo-auditable >/dev/null; then
  echo "== installing cargo-auditable" >&2
  cargo install cargo-auditable --version 0.7.7 --locked --quiet >&2
fi

echo "== cargo auditable build --release (connector, operator)" >&2
cargo auditable build --release --locked --quiet \
  -p kubemq-amqp-connector --bin kubemq-amqp-connector \
  -p kubemq-amqp-operator --bin kubemq-amqp-operator >&2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT"

# The files every image has, as in gcr.io/distroless/cc-debian12:nonroot.
base_rootfs() { # dir
  local r=$1
  mkdir -p "$r"/{etc/ssl/certs,tmp,home/nonroot,root}
  chmod 1777 "$r/tmp"
  chmod 0700 "$r/root"
  chown 65532:65532 "$r/home/nonroot"
  cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
  cat > "$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
  cat > "$r/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
nonroot:x:65532:
EOF
  # Host names from /etc/hosts first (Kubernetes writes the pod's), then DNS (cluster Services).
  cat > "$r/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
shadow: files
hosts: files dns
networks: files
protocols: files
services: files
ethers: files
rpc: files
EOF
}

# Copies `binary` without its debug info to `dest` inside rootfs `r`, with every shared library
# the dynamic loader resolves for it at the path it resolves it to (glibc's files and dns lookups are built into
# libc.so.6, so nothing is loaded later by name).
install_binary() { # r binary dest
  local r=$1 bin=$2 dest=$3
  mkdir -p "$r$(dirname "$dest")"
  objcopy --strip-debug "$bin" "$r$dest"
  chmod 0755 "$r$dest"
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    mkdir -p "$r$(dirname "$lib")"
    cp -L "$lib" "$r$lib"
  done
}

# What a vulnerability scanner reads in a distroless image: one dpkg status file per Debian
# package whose files the image holds (/var/lib/dpkg/status.d/<package>), with the version that
# was copied. The CA bundle is generated from the ca-certificates package, which owns no file
# of that name.
package_metadata() { # r
  local r=$1 f pkg
  mkdir -p "$r/var/lib/dpkg/status.d"
  {
    echo ca-certificates
    find "$r" -type f -name '*.so*' | while read -r f; do
      f=${f#"$r"}
      dpkg -S "$f" 2>/dev/null || dpkg -S "$(realpath "$f")"
    done | cut -d: -f1
  } | sort -u | while read -r pkg; do
    dpkg-query -W -f='Package: ${Package}\nStatus: install ok installed\nVersion: ${Version}\nArchitecture: ${Architecture}\nSource: ${Source}\nMaintainer: ${Maintainer}\nHomepage: ${Homepage}\n' "$pkg" |
      grep -v ': $' > "$r/var/lib/dpkg/status.d/$pkg"
  done
}
for target in connector operator; do
  name=kubemq-amqp-$target
  spec=$(python3 images/stage.py Dockerfile "$target" "$VERSION")
  field() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); exec(sys.argv[2])' "$spec" "$1"; }
  r="$work/$target/rootfs"
  base_rootfs "$r"
  while IFS=$'\t' read -r source destination owner; do
    case "$source" in
      # The builder's /out/bin: release binaries without their debug info.
      /out/bin/*) install_binary "$r" "$ROOT/target/release/${source#/out/bin/}" "$destination" ;;
      # The rest of /out: empty folders, made to be owned by the image's user.
      /out/*) mkdir -p "$r$destination" ;;
      *) echo "build.sh: cannot copy $source" >&2; exit 1 ;;
    esac
    [ "$owner" = None ] || chown -R "$owner" "$r$destination"
  done < <(field 'for c in d["copies"]: print(c["source"], c["destination"], c["owner"], sep="\t")')
  package_metadata "$r"

  config=(--config.user "$(field 'print(d["user"])')")
  while read -r a; do config+=(--config.entrypoint "$a"); done < <(field 'print(*d["entrypoint"], sep="\n")')
  while read -r p; do config+=(--config.exposedports "$p"); done < <(field 'print(*d["exposed"], sep="\n")')
  while read -r v; do [ -z "$v" ] || config+=(--config.volume "$v"); done < <(field 'print(*d["volumes"], sep="\n")')
  while read -r l; do config+=(--config.label "$l"); done < <(field 'print(*(f"{k}={v}" for k, v in d["labels"].items()), sep="\n")')
  workdir=$(field 'print(d["workdir"] or "/")')
  config+=(--config.workingdir "$workdir")
  config+=(--config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
  config+=(--config.env "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt")

  layout="$OUT/$name"
  rm -rf "$layout"
  umoci init --layout "$layout"
  umoci new --image "$layout:$VERSION"
  umoci unpack --image "$layout:$VERSION" "$work/$target/bundle" >/dev/null
  cp -a "$r/." "$work/$target/bundle/rootfs/"
  umoci repack --image "$layout:$VERSION" "$work/$target/bundle"
  umoci config --image "$layout:$VERSION" "${config[@]}"
  umoci gc --layout "$layout"
  echo "== $name:$VERSION in $layout" >&2
done
echo "$OUT"
