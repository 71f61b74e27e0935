#!/usr/bin/env bash
# A real kube-apiserver (and etcd) on 127.0.0.1 for the e2e suite (tests/e2e.rs).
#
#   tests/e2e/apiserver.sh build          build kube-apiserver 1.20.2, and the node's kubelet, kube-controller-manager,
#                                         kube-scheduler and kube-proxy, from Debian's source once (17 to 20 minutes
#                                         on 2 cores), into $E2E_CACHE (default ~/.cache/sidecar-injector-e2e); reused
#                                         when present. Installs Debian's golang-go, etcd-server.
#   tests/e2e/apiserver.sh start DIR      start etcd and kube-apiserver with certificates generated in DIR, wait for
#                                         /readyz, write DIR/kubeconfig and DIR/env (the ports, the PIDs);
#                                         SERVICE_CIDR and APISERVER_EXTRA_ARGS (word-split) are for cluster.sh
#   tests/e2e/apiserver.sh stop DIR       stop both by PID
set -euo pipefail

CACHE="${E2E_CACHE:-$HOME/.cache/sidecar-injector-e2e}"
APISERVER="$CACHE/kube-apiserver"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Everything the e2e suite runs from Kubernetes, built from one Debian source tree: the API server for the bare
# API server tests, and the node's binaries for the cluster tests (tests/e2e/cluster.sh).
BINARIES="kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy"

build() {
  local missing=""
  for bin in $BINARIES; do [ -x "$CACHE/$bin" ] || missing="$missing $bin"; done
  if [ -z "$missing" ]; then
    echo "kubernetes $(cat "$CACHE/source-version" 2>/dev/null || echo '?'): cached in $CACHE"
    return
  fi
  # Debian's packages: the Go toolchain, reflect2 1.0.2 (the vendored 1.0.1 breaks with Go 1.18+), etcd.
  if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
    as_root sed -i 's/^Types: deb$/Types: deb deb-src/' /etc/apt/sources.list.d/debian.sources
  fi
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends golang-go golang-github-modern-go-reflect2-dev \
    etcd-server dpkg-dev rsync openssl curl python3 >/dev/null
  mkdir -p "$CACHE"
  local work="$CACHE/src"
  rm -rf "$work" && mkdir -p "$work"
  (cd "$work" && apt-get source -qq --download-only kubernetes >/dev/null && dpkg-source -x --skip-patches ./*.dsc k8s >/dev/null)
  local src="$work/k8s" what=""
  rm -rf "$src/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$src/vendor/github.com/modern-go/reflect2"
  for bin in $BINARIES; do what="$what cmd/$bin"; done
  # One make for all five: they share most packages, so the node's four cost ~4 minutes on top of the API server.
  # CGO_ENABLED=0: static binaries (the kubelet too), so they run on any machine of this kind.
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=vendor GOTOOLCHAIN=local KUBE_GIT_VERSION=v1.20.2 \
    make WHAT="${what# }" >"$CACHE/build.log" 2>&1) || { tail -30 "$CACHE/build.log"; exit 1; }
  for bin in $BINARIES; do cp "$src/_output/bin/$bin" "$CACHE/$bin"; done
  # The pause container's source, for the node's sandbox image (tests/e2e/cluster.sh builds it with gcc).
  cp "$src/build/pause/linux/pause.c" "$CACHE/pause.c"
  (cd "$work" && ls ./*.dsc | sed 's/.*_//; s/\.dsc$//') > "$CACHE/source-version"
  rm -rf "$work"
  echo "kubernetes $(cat "$CACHE/source-version"): built into $CACHE"
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
    --disable-admission-plugins ServiceAccount ${APISERVER_EXTRA_ARGS:-} >"$dir/apiserver.log" 2>&1 &
  echo "APISERVER_PID=$!" >> "$dir/env"
  echo "APISERVER_PORT=$port" >> "$dir/env"
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
    sleep 0.5
  done
  echo "kube-apiserver did not become ready; last lines of its log:" >&2
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
  start) start "${2:?usage: $0 start DIR}" ;;
  stop) stop "${2:?usage: $0 stop DIR}" ;;
  *) echo "usage: $0 build | start DIR | stop DIR" >&2; exit 2 ;;
esac
