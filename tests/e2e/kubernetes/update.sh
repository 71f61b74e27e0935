#!/usr/bin/env bash
# Moves the module tests/e2e/apiserver.sh builds Kubernetes from to another release:
#
#   tests/e2e/kubernetes/update.sh 1.37.2
#
# writes go.mod (k8s.io/kubernetes at that release, each staging module it replaces pinned to v0.N.P) and go.sum
# (every module the six commands need, checked against the Go checksum database). Then set NEWEST in
# tests/e2e/apiserver.sh to the same release.
set -euo pipefail
cd "$(dirname "$0")"
release=${1:?usage: $0 RELEASE (1.N.P)}
release=${release#v}
minor_patch=${release#1.}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
upstream=$(go mod download -json "k8s.io/kubernetes@v$release" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
{
  echo "module sidecar-injector.test/kubernetes"
  echo
  echo "go $(awk '$1 == "go" {print $2; exit}' "$upstream")"
  echo
  echo "require k8s.io/kubernetes v$release"
  echo
  echo "replace ("
  # k8s.io/X => ./staging/src/k8s.io/X, in upstream's replace block: the same module at v0.N.P.
  sed -n '/^replace (/,/^)/p' "$upstream" | awk -v v="v0.$minor_patch" '$3 ~ /^\.\/staging\// {print "\t" $1 " => " $1 " " v}'
  echo ")"
} > go.mod
commands=""
for cmd in kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
  commands="$commands k8s.io/kubernetes/cmd/$cmd@v$release"
done
GOFLAGS=-mod=mod go get $commands
cd - >/dev/null
{
  echo "// What tests/e2e/apiserver.sh builds Kubernetes from (the newest release the suite tests): k8s.io/kubernetes at"
  echo "// the release and each staging module it replaces with a directory of its own (which Go ignores outside that"
  echo "// module) pinned to the matching v0.N.P. To move to a newer release: tests/e2e/kubernetes/update.sh VERSION."
  cat "$work/go.mod"
} > go.mod
cp "$work/go.sum" go.sum
echo "go.mod and go.sum now build Kubernetes $release; set NEWEST=$release in tests/e2e/apiserver.sh"
