#!/usr/bin/env bash
# Builds sidecar-injector's image without a container daemon, with buildah (Debian: `apt-get install buildah`), as
# an OCI archive that `ctr images import`, `podman load` and `kind load image-archive` accept:
#
#   manifests/image.sh [--tag NAME:TAG] [--out FILE] [--binary PATH]
#
# The image is the one the Dockerfile builds: the same binary (`manifests/pgo-build.sh`: the dist profile,
# profile-guided), and the user, entrypoint, command, ports and labels read from the Dockerfile's last stage, so
# the two cannot drift. Instead of distroless it carries only the shared libraries the binary links (glibc, libgcc),
# at the paths it loads them from. Nothing in it writes to its root filesystem. --binary uses a binary already
# built (the tests pass theirs).
set -euo pipefail

cd "$(dirname "$0")/.."
tag=sidecar-injector:dev
out=""
binary=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
    --out) out=${2:?--out needs a file}; shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
out=${out:-sidecar-injector-image.tar}
command -v buildah >/dev/null || { echo "image.sh: buildah is not installed (apt-get install buildah)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || echo "image.sh: not root: buildah needs rootless setup (subuids) or sudo" >&2
if [ -z "$binary" ]; then
  binary=target/pgo/sidecar-injector
  manifests/pgo-build.sh --profile dist --out "$binary" >/dev/null
fi
[ -x "$binary" ] || { echo "image.sh: $binary is not an executable" >&2; exit 1; }

# The Dockerfile's last stage: its USER, ENTRYPOINT, CMD, EXPOSE and LABEL instructions (one line each).
last_stage=$(awk '/^FROM /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' Dockerfile)
instruction() { printf '%s' "$last_stage" | sed -n "s/^$1 //p"; }
user=$(instruction USER)
entrypoint=$(instruction ENTRYPOINT)
cmd=$(instruction CMD)
[ -n "$user" ] && [ -n "$entrypoint" ] || { echo "image.sh: no USER or ENTRYPOINT in the Dockerfile's last stage" >&2; exit 1; }

b() { buildah --storage-driver vfs "$@"; }
container=$(b from scratch)
trap 'b rm "$container" >/dev/null 2>&1 || true' EXIT
root=$(b mount "$container")
# The binary where the Dockerfile puts it (its ENTRYPOINT), and each library at the path the loader finds it.
target=$(printf '%s' "$entrypoint" | sed 's/^\["\([^"]*\)".*/\1/')
install -D -m 0755 "$binary" "$root$target"
for lib in $(ldd "$binary" | grep -o '/[^ ]*' | sort -u); do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
# /tmp is the one place a library might write; the Deployment mounts nothing there and keeps the root read-only.
install -d -m 1777 "$root/tmp"
b umount "$container" >/dev/null
config=(--user "$user" --entrypoint "$entrypoint" --workingdir /)
[ -n "$cmd" ] && config+=(--cmd "$cmd")
for port in $(instruction EXPOSE); do
  # Docker records `EXPOSE 8443` as 8443/tcp.
  case "$port" in */*) ;; *) port="$port/tcp" ;; esac
  config+=(--port "$port")
done
while IFS= read -r label; do
  [ -n "$label" ] && config+=(--label "$(printf '%s' "$label" | sed 's/"//g')")
done < <(instruction LABEL)
b config "${config[@]}" "$container"
# The archive names the image as Docker normalises `NAME:TAG` (docker.io/library/NAME:TAG), which is the name the
# kubelet asks containerd for; `ctr images import` keeps the archive's name as written.
first=${tag%%/*}
if [ "$first" = "$tag" ]; then
  tag="docker.io/library/$tag"
elif [ "$first" != localhost ] && [ "${first#*[.:]}" = "$first" ]; then
  tag="docker.io/$tag"
fi
rm -f "$out"
b commit --quiet --format oci "$container" "oci-archive:$out:$tag" >/dev/null
echo "image.sh: wrote $out ($tag, $(du -h "$out" | cut -f1)); import it with: ctr -n k8s.io images import $out, podman load -i $out, or kind load image-archive $out"
