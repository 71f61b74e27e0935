#!/usr/bin/env bash
# Helm, for the chart's tests (tests/e2e/helm.rs): the chart in charts/sidecar-injector must render the objects
# the kustomize manifests do, and `helm lint` must be clean. Built with Go from the module proxy, as the newest
# Kubernetes release is (tests/e2e/apiserver.sh), so it needs nothing beside Go and the proxy.
#
#   helm 4.3.1 (helm.sh/helm/v4), cold in about 6 minutes on 2 cores (measured: 5 min 43 s with empty module and
#   build caches, downloads included, while the machine was also building Kubernetes and the workspace); reused
#   after, in well under a second
#
#   tests/e2e/helm.sh build    install helm once into $E2E_CACHE/helm-<version>/helm (default
#                              ~/.cache/sidecar-injector-e2e); reused when present
#   tests/e2e/helm.sh bin      print the path of that helm (whether it is built or not)
set -euo pipefail

CACHE="${E2E_CACHE:-$HOME/.cache/sidecar-injector-e2e}"
# The release, in one place: tests/e2e/helm.rs asks this script (`bin`).
VERSION=4.3.1
DIR="$CACHE/helm-$VERSION"
HELM="$DIR/helm"

build() {
  if [ -x "$HELM" ]; then
    echo "helm $VERSION: cached in $HELM"
    return
  fi
  command -v go >/dev/null || { echo "helm.sh: building helm $VERSION needs Go (go.dev); this machine has none" >&2; exit 1; }
  mkdir -p "$DIR"
  local start=$SECONDS
  # Static, and stamped with its version as helm's own Makefile does (`helm version` reports it). Installed into a
  # directory of its own, then moved: a build that fails half-way leaves no helm behind to be reused.
  local work
  work=$(mktemp -d)
  CGO_ENABLED=0 GOBIN="$work" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$VERSION" \
    "helm.sh/helm/v4/cmd/helm@v$VERSION"
  mv "$work/helm" "$HELM"
  rmdir "$work"
  echo "helm $VERSION: built into $HELM in $((SECONDS - start)) s"
}

case "${1:-}" in
  build) build ;;
  bin) echo "$HELM" ;;
  *) echo "usage: $0 build | bin" >&2; exit 2 ;;
esac
