#!/usr/bin/env bash
# A real kube-apiserver (and etcd) on 127.0.0.1 for the e2e suite (tests/e2e.rs), at one of the two Kubernetes
# releases the suite tests: E2E_KUBERNETES=newest (the default) or oldest.
#
#   newest  1.37.2, the newest release the Go module proxy serves: built with Go from the module k8s.io/kubernetes
#           (a module of ours pins its staging modules, tests/e2e/kubernetes/), cold in about 12 minutes on 2 cores
#           (measured: 11 min 48 s for the API server, the node's binaries and kubectl)
#   oldest  1.20.2, the oldest release we support: built from Debian's source package with Debian's Go 1.19 (which
#           that source needs; Go 1.26 does not build it), the API server alone in 4 to 9 minutes
#
#   tests/e2e/apiserver.sh build          build that release's binaries once into $E2E_CACHE/<release> (default
#                                         ~/.cache/sidecar-injector-e2e): the API server, and for the newest the
#                                         node's too (kubelet, kube-controller-manager, kube-scheduler, kube-proxy)
#                                         and kubectl; reused when present. Installs Debian's etcd-server (and for
#                                         the oldest golang-go). E2E_NODE=1 builds the oldest node's binaries too
#   tests/e2e/apiserver.sh bin            print the directory that holds the release's binaries
#   tests/e2e/apiserver.sh release        print the release (1.N.P)
#   tests/e2e/apiserver.sh kubectl        print the kubectl the suite runs (the newest's, else the one on PATH)
#   tests/e2e/apiserver.sh start DIR      start etcd and kube-apiserver with certificates generated in DIR, wait for
#                                         /readyz, write DIR/kubeconfig and DIR/env (the ports, the PIDs, the
#                                         release); SERVICE_CIDR and APISERVER_EXTRA_ARGS (word-split) are for
#                                         cluster.sh
#   tests/e2e/apiserver.sh stop DIR       stop both by PID
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${E2E_CACHE:-$HOME/.cache/sidecar-injector-e2e}"
# The two releases, in one place: tests/e2e.rs and tests/cluster.rs ask this script (`release`).
NEWEST=1.37.2
OLDEST=1.20.2
case "${E2E_KUBERNETES:-newest}" in
  newest | "$NEWEST") RELEASE=$NEWEST ;;
  oldest | "$OLDEST") RELEASE=$OLDEST ;;
  *) echo "apiserver.sh: E2E_KUBERNETES is newest or oldest (or $NEWEST, $OLDEST), not '$E2E_KUBERNETES'" >&2; exit 2 ;;
esac
BIN="$CACHE/$RELEASE"
APISERVER="$BIN/kube-apiserver"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# What each build makes. The node's binaries come with the newest (the cluster tests run it); the oldest builds
# them only when asked (E2E_NODE=1), since its cluster test is not part of CI.
NODE_BINARIES="kubelet kube-controller-manager kube-scheduler kube-proxy"
if [ "$RELEASE" = "$NEWEST" ]; then
  BINARIES="kube-apiserver $NODE_BINARIES kubectl"
elif [ "${E2E_NODE:-0}" = 1 ]; then
  BINARIES="kube-apiserver $NODE_BINARIES"
else
  BINARIES="kube-apiserver"
fi

build() {
  local missing=""
  for bin in $BINARIES; do [ -x "$BIN/$bin" ] || missing="$missing $bin"; done
  [ -f "$BIN/pause.c" ] || missing="$missing pause.c"
  if ! command -v etcd >/dev/null; then
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends etcd-server openssl curl python3 >/dev/null
  fi
  if [ -z "$missing" ]; then
    echo "kubernetes $RELEASE: cached in $BIN"
    return
  fi
  mkdir -p "$BIN"
  local start=$SECONDS
  if [ "$RELEASE" = "$NEWEST" ]; then build_from_go_modules; else build_from_debian_source; fi
  echo "kubernetes $RELEASE: built into $BIN in $((SECONDS - start)) s"
}

# The newest: `go build` of k8s.io/kubernetes/cmd/... from a module of ours. k8s.io/kubernetes replaces its staging
# modules (k8s.io/api, k8s.io/apiserver, ...) with directories of its own repository, which Go ignores outside
# that module, so ours pins each to the matching v0.N.P. The binaries are static (CGO_ENABLED=0) and carry the
# release as their version (the API server's /version, the node's kubeletVersion), as Kubernetes' own build stamps it.
build_from_go_modules() {
  command -v go >/dev/null || { echo "apiserver.sh: building Kubernetes $RELEASE needs Go (go.dev); this machine has none" >&2; exit 1; }
  local module="$HERE/kubernetes" work
  work=$(mktemp -d)
  cp "$module/go.mod" "$module/go.sum" "$work/"
  local minor=${RELEASE#1.}; minor=${minor%%.*}
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$RELEASE"
  ldflags="$ldflags -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags="$ldflags -X k8s.io/component-base/version.gitTreeState=clean"
  local packages=""
  for bin in $BINARIES; do packages="$packages k8s.io/kubernetes/cmd/$bin"; done
  (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "$ldflags" -o "$BIN/" $packages \
    >"$BIN/build.log" 2>&1) || { tail -30 "$BIN/build.log"; exit 1; }
  # The pause container's source, for the node's sandbox image (tests/e2e/cluster.sh builds it with gcc).
  local source
  source=$(cd "$work" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  cp "$source/build/pause/linux/pause.c" "$BIN/pause.c"
  rm -rf "$work"
}

# The oldest: Debian's kubernetes source package (1.20.2) with Debian's Go and reflect2 1.0.2 (the vendored 1.0.1
# breaks with Go 1.18+). GOTOOLCHAIN=local keeps Go 1.19: nothing newer builds this tree.
build_from_debian_source() {
  if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
    as_root sed -i 's/^Types: deb$/Types: deb deb-src/' /etc/apt/sources.list.d/debian.sources
  fi
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends golang-go golang-github-modern-go-reflect2-dev \
    dpkg-dev rsync >/dev/null
  local work="$BIN/src"
  rm -rf "$work" && mkdir -p "$work"
  (cd "$work" && apt-get source -qq --download-only kubernetes >/dev/null && dpkg-source -x --skip-patches ./*.dsc k8s >/dev/null)
  local src="$work/k8s" what=""
  rm -rf "$src/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$src/vendor/github.com/modern-go/reflect2"
  for bin in $BINARIES; do what="$what cmd/$bin"; done
  # Debian's Go by its path: the Go first on PATH may be a newer one.
  # CGO_ENABLED=0: static binaries (the kubelet too), so they run on any machine of this kind.
  (cd "$src" && PATH="/usr/lib/go/bin:$PATH" CGO_ENABLED=0 GOFLAGS=-mod=vendor GOTOOLCHAIN=local \
    KUBE_GIT_VERSION=v$RELEASE make WHAT="${what# }" >"$BIN/build.log" 2>&1) || { tail -30 "$BIN/build.log"; exit 1; }
  for bin in $BINARIES; do cp "$src/_output/bin/$bin" "$BIN/$bin"; done
  cp "$src/build/pause/linux/pause.c" "$BIN/pause.c"
  rm -rf "$work"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() {
  local dir="$1"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  [ -x "$APISERVER" ] || { echo "no kube-apiserver at $APISERVER: run '$0 build' first" >&2; exit 1; }
  # The address it listens on and advertises (the `kubernetes` Service's endpoint): loopback, unless a cluster's
  # pods must reach it (cluster.sh gives the node's bridge address).
  local address="${APISERVER_ADDRESS:-127.0.0.1}"
  # Certificates: a CA, the API server's serving certificate, an admin client (system:masters), SA keys.
  (
    cd "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=e2e-ca \
      -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=kube-apiserver \
      -keyout apiserver.key -out apiserver.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,IP:%s,DNS:localhost,DNS:kubernetes.default.svc%s\n' "$address" \
      "${APISERVER_EXTRA_SANS:+,$APISERVER_EXTRA_SANS}" > apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/O=system:masters/CN=e2e-admin" \
      -keyout admin.key -out admin.csr 2>/dev/null
    # Extensions make it an X.509 v3 certificate (rustls, our test client, refuses v1).
    printf 'extendedKeyUsage=clientAuth\n' > admin.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile admin.ext -out admin.crt 2>/dev/null
    openssl ecparam -name prime256v1 -genkey -noout -out sa.key 2>/dev/null
    openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  local etcd_client etcd_peer port
  # A bare API server has no controller to make each namespace's `default` ServiceAccount, which the
  # ServiceAccount plugin would wait for: off unless the caller (cluster.sh) says otherwise.
  local disabled=${APISERVER_DISABLED_PLUGINS-ServiceAccount}
  # On loopback the `kubernetes` Service gets no endpoint (later releases refuse to advertise one there): nothing
  # calls the API server through it but pods, and a bare API server has none.
  local reconciler=""
  case "$address" in 127.*) reconciler="--endpoint-reconciler-type none" ;; esac
  etcd_client="$(free_port)"; etcd_peer="$(free_port)"; port="$(free_port)"
  etcd --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$etcd_client" \
    --advertise-client-urls "http://127.0.0.1:$etcd_client" --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "default=http://127.0.0.1:$etcd_peer" >"$dir/etcd.log" 2>&1 &
  echo "ETCD_PID=$!" > "$dir/env"
  "$APISERVER" --etcd-servers "http://127.0.0.1:$etcd_client" --bind-address "$address" --secure-port "$port" \
    --advertise-address "$address" --tls-cert-file "$dir/apiserver.crt" --tls-private-key-file "$dir/apiserver.key" \
    --client-ca-file "$dir/ca.crt" --authorization-mode RBAC \
    --service-account-key-file "$dir/sa.pub" --service-account-signing-key-file "$dir/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range "${SERVICE_CIDR:-10.0.0.0/24}" \
    --enable-admission-plugins MutatingAdmissionWebhook,ValidatingAdmissionWebhook \
    ${disabled:+--disable-admission-plugins "$disabled"} $reconciler ${APISERVER_EXTRA_ARGS:-} >"$dir/apiserver.log" 2>&1 &
  local apiserver_pid=$!
  echo "APISERVER_PID=$apiserver_pid" >> "$dir/env"
  echo "APISERVER_PORT=$port" >> "$dir/env"
  echo "KUBERNETES_RELEASE=$RELEASE" >> "$dir/env"
  cat > "$dir/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "https://$address:$port", certificate-authority: "$dir/ca.crt"}
users:
- name: admin
  user: {client-certificate: "$dir/admin.crt", client-key: "$dir/admin.key"}
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
KUBECONFIG
  for _ in $(seq 1 120); do
    if curl -sf --cacert "$dir/ca.crt" --cert "$dir/admin.crt" --key "$dir/admin.key" \
        "https://$address:$port/readyz" >/dev/null 2>&1; then
      echo "kube-apiserver ready on $address:$port"
      return
    fi
    kill -0 "$apiserver_pid" 2>/dev/null || break
    sleep 0.5
  done
  echo "kube-apiserver did not become ready (or exited); last lines of its log:" >&2
  tail -20 "$dir/apiserver.log" >&2
  stop "$dir"
  exit 1
}

stop() {
  local dir="$1"
  [ -f "$dir/env" ] || return 0
  # shellcheck disable=SC1091
  . "$dir/env"
  # The API server first (it may wait on etcd while shutting down), then etcd; each gets 5 s, then SIGKILL.
  for pid in "${APISERVER_PID:-}" "${ETCD_PID:-}"; do
    [ -n "$pid" ] || continue
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}

case "${1:-}" in
  build) build ;;
  bin) echo "$BIN" ;;
  # The kubectl the suite runs: the newest release's where it is built (`apply -k` is then that release's
  # kustomize), else the one on PATH.
  kubectl) if [ -x "$CACHE/$NEWEST/kubectl" ]; then echo "$CACHE/$NEWEST/kubectl"; else command -v kubectl; fi ;;
  release) echo "$RELEASE" ;;
  start) start "${2:?usage: $0 start DIR}" ;;
  stop) stop "${2:?usage: $0 stop DIR}" ;;
  *) echo "usage: $0 build | bin | release | kubectl | start DIR | stop DIR" >&2; exit 2 ;;
esac
