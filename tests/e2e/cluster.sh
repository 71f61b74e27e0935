#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, for the cluster tests (tests/cluster.rs), at the release
# apiserver.sh builds (E2E_KUBERNETES: newest, the default, or oldest with E2E_NODE=1): the API server and
# etcd of apiserver.sh on 127.0.0.1, a kube-controller-manager, a kube-scheduler, a kubelet on Debian's containerd
# and runc, a kube-proxy (iptables mode), and a bridge network of its own. Every packet stays on the machine: pods
# live on the bridge sie2e0 (10.209.0.0/24, Services 10.209.1.0/24) with no default route and no masquerade, a
# FORWARD rule drops whatever would leave the bridge, and containerd reaches registries only through a proxy that
# does not exist, so a pull attempt fails at once instead of downloading.
#
#   tests/e2e/cluster.sh build              the Kubernetes binaries (apiserver.sh build), Debian's runtime packages,
#                                           and the node's images (pause, busybox) as OCI archives, all cached
#   tests/e2e/cluster.sh up DIR             start the cluster with its state in DIR; DIR/kubeconfig; wait for the
#                                           node to be Ready. Records the host's state first (DIR/host-before)
#   tests/e2e/cluster.sh import DIR FILE    import an OCI or Docker archive into the node's containerd
#   tests/e2e/cluster.sh down DIR           stop it all and put the host back (sysctls, iptables, links, mounts,
#                                           cgroups, the paths the kubelet hard-codes); harmless when run twice
#   tests/e2e/cluster.sh host-diff DIR      what differs from DIR/host-before (empty when the host is as it was)
#
# Needs root, cgroup v1 or v2 with the cpu, memory and pids controllers, and a kubectl with kustomize v4 or later
# (kubectl 1.21+). Failures are one line on stderr and exit 1; `up` tears down what it started before it exits.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# The release's binaries (kube-apiserver, the node's, and for the newest kubectl), as apiserver.sh builds them.
BIN="$("$HERE/apiserver.sh" bin)"
RELEASE="$("$HERE/apiserver.sh" release)"
MINOR=${RELEASE#1.}; MINOR=${MINOR%%.*}
IMAGES="${E2E_CACHE:-$HOME/.cache/sidecar-injector-e2e}/images"
# The release's own kubectl where it was built (the newest's), so that `apply -k` is that release's kustomize.
if [ -x "$BIN/kubectl" ]; then export PATH="$BIN:$PATH"; fi
BRIDGE=sie2e0
POD_CIDR=10.209.0.0/24
NODE_IP=10.209.0.1
SERVICE_CIDR=10.209.1.0/24
# The first address of SERVICE_CIDR: the `kubernetes` Service, through which pods reach the API server.
KUBERNETES_SERVICE_IP=10.209.1.1
NODE_NAME=sidecar-injector-e2e
# The node's images, imported at `up` under the names pods and containerd ask for.
PAUSE_IMAGE=localhost/sidecar-injector-e2e/pause:3.4
BUSYBOX_IMAGE=docker.io/library/busybox:1.36
# The sysctls the kubelet, kube-proxy and the bridge plugin set, restored by `down` (host-diff compares them all).
SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv4.conf.default.forwarding
net.ipv4.conf.all.route_localnet net.ipv6.conf.all.forwarding net.ipv6.conf.default.forwarding
net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables net.netfilter.nf_conntrack_max
net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait"
# Paths the kubelet, CNI and containerd use whatever their configuration says.
HARDCODED_PATHS="/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd /run/netns
/opt/containerd /etc/cni"

fail() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*"; }

# --- build -------------------------------------------------------------------------------------------------------

build() {
  E2E_NODE=1 "$HERE/apiserver.sh" build
  local packages="containerd runc containernetworking-plugins iptables nftables buildah busybox-static gcc libc6-dev
    conntrack"
  local missing=""
  for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
  mkdir -p "$IMAGES"
  [ -f "$IMAGES/pause.tar" ] || image_from_binary pause "$PAUSE_IMAGE" /pause "$(build_pause)"
  [ -f "$IMAGES/busybox.tar" ] || image_from_binary busybox "$BUSYBOX_IMAGE" /bin/sh /bin/busybox
  log "kubernetes $RELEASE in $BIN, images in $IMAGES"
}

# The pause container, from the Kubernetes source's pause.c, linked statically.
build_pause() {
  local out="$IMAGES/pause"
  gcc -Os -static -o "$out" "$BIN/pause.c" -DVERSION=v3.4-sidecar-injector-e2e
  echo "$out"
}

# An image of one static binary (busybox gets its applets' links); written as an OCI archive.
image_from_binary() {
  local name=$1 ref=$2 entrypoint=$3 binary=$4
  local ctr
  ctr=$(buildah --storage-driver vfs from scratch)
  if [ "$name" = busybox ]; then
    local root
    root=$(buildah --storage-driver vfs mount "$ctr")
    mkdir -p "$root/bin" "$root/tmp" "$root/etc"
    cp "$binary" "$root/bin/busybox"
    for applet in $("$binary" --list); do [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"; done
    echo 'root:x:0:0:root:/root:/bin/sh' > "$root/etc/passwd"
    chmod 1777 "$root/tmp"
    buildah --storage-driver vfs umount "$ctr" >/dev/null
    buildah --storage-driver vfs config --cmd /bin/sh "$ctr"
  else
    buildah --storage-driver vfs copy "$ctr" "$binary" "$entrypoint" >/dev/null
    buildah --storage-driver vfs config --entrypoint "[\"$entrypoint\"]" "$ctr"
  fi
  buildah --storage-driver vfs commit --quiet --format oci "$ctr" "oci-archive:$IMAGES/$name.tar:$ref" >/dev/null
  buildah --storage-driver vfs rm "$ctr" >/dev/null
}

# --- up ----------------------------------------------------------------------------------------------------------

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

preflight() {
  [ "$(id -u)" = 0 ] || fail "must run as root (the kubelet and containerd manage cgroups, mounts and networks)"
  for bin in kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy; do
    [ -x "$BIN/$bin" ] || fail "no $bin in $BIN: run '$0 build' first"
  done
  for f in pause.tar busybox.tar; do [ -f "$IMAGES/$f" ] || fail "no image $f in $IMAGES: run '$0 build' first"; done
  for cmd in containerd runc ctr iptables iptables-save ip python3 curl kubectl; do
    command -v "$cmd" >/dev/null || fail "$cmd is not installed (run '$0 build'; kubectl 1.21 or later is needed too)"
  done
  [ -x /usr/lib/cni/bridge ] || fail "no CNI plugins in /usr/lib/cni: apt-get install containernetworking-plugins"
  local controller
  for controller in cpu memory pids; do
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
      grep -qw "$controller" /sys/fs/cgroup/cgroup.controllers || fail "cgroup controller $controller is not available"
    else
      [ -d "/sys/fs/cgroup/$controller" ] || fail "cgroup controller $controller is not mounted at /sys/fs/cgroup/$controller"
    fi
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    fail "a cluster is already up (bridge $BRIDGE exists): run '$0 down DIR' with its directory first"
  fi
  kubectl version --client -o json 2>/dev/null | python3 -c '
import json, sys
v = json.load(sys.stdin)["clientVersion"]
minor = int("".join(c for c in v["minor"] if c.isdigit()))
sys.exit(0 if int(v["major"]) == 1 and minor >= 21 else 1)' \
    || fail "kubectl $(kubectl version --client -o json 2>/dev/null | grep -o '"gitVersion": "[^"]*"' || true) is too old: kubectl apply -k needs kustomize v4 (kubectl 1.21 or later)"
}

# What `down` must put back and `host-diff` compares.
snapshot_host() {
  local out=$1
  mkdir -p "$out"
  for key in $SYSCTLS; do
    printf '%s = %s\n' "$key" "$(sysctl -n "$key" 2>/dev/null || echo absent)"
  done > "$out/sysctls"
  # Chains and rules as "table chain" and "table rule"; the nftables tables iptables-nft made (empty ones too).
  local tool
  for tool in iptables ip6tables; do
    $tool-save 2>/dev/null | awk '/^\*/ {t = substr($0, 2)} /^:/ {print t, $1} /^-A/ {print t, $0}' | sort \
      > "$out/$tool" || true
  done
  nft list tables 2>/dev/null | sort > "$out/nft-tables" || true
  ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort > "$out/links"
  ip route show | sort > "$out/routes"
  awk '{print $5}' /proc/self/mountinfo | sort > "$out/mounts"
  for path in $HARDCODED_PATHS; do [ -e "$path" ] && echo "$path"; done > "$out/paths" || true
  find /sys/fs/cgroup -maxdepth 2 -type d -name 'kubepods*' 2>/dev/null | sort > "$out/cgroups" || true
}

up() {
  local dir=$1
  preflight
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  echo "$dir" > "$dir/.cluster"
  snapshot_host "$dir/host-before"
  # From here on, a failure (an error, or `fail`) tears down what was started.
  trap 'status=$?; if [ "$status" != 0 ]; then echo "cluster.sh: up failed; tearing down" >&2; down "'"$dir"'" >/dev/null 2>&1 || true; fi' EXIT
  mkdir -p "$dir/logs" "$dir/cni/net.d" "$dir/cni/ipam" "$dir/containerd" "$dir/kubelet"

  # The bridge first, with the node's address: the kubelet needs its node IP to exist on an interface.
  ip link add "$BRIDGE" type bridge
  ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Service addresses are answered by kube-proxy's DNAT; until it runs, this keeps them on the bridge.
  ip route add "$SERVICE_CIDR" dev "$BRIDGE"
  # Nothing a pod sends leaves the bridge (no default route in pods either; this holds if one is added).
  iptables -N SIE2E-GUARD
  iptables -A SIE2E-GUARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
  iptables -I FORWARD 1 -j SIE2E-GUARD
  printf 'nameserver 127.0.0.1\n' > "$dir/resolv.conf"

  cat > "$dir/cni/net.d/10-sie2e.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "sie2e",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "10.209.0.0/16"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON

  cat > "$dir/containerd/config.toml" <<TOML
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
plugin_dir = ""
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine grants no CAP_SYS_RESOURCE: a negative oom_score_adj fails every sandbox without this.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
TOML
  # Registries only through a proxy that is not there: a pull attempt fails on loopback, nothing is downloaded.
  HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY= \
    containerd --config "$dir/containerd/config.toml" >"$dir/logs/containerd.log" 2>&1 &
  echo "CONTAINERD_PID=$!" > "$dir/node.env"
  local sock="$dir/containerd/containerd.sock"
  for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || { tail -3 "$dir/logs/containerd.log" >&2; fail "containerd did not start (log: $dir/logs/containerd.log)"; }
  for f in "$IMAGES"/*.tar; do import "$dir" "$f" >/dev/null; done

  # The control plane: etcd and the API server (apiserver.sh), then the controllers and the scheduler.
  local kubelet_port kubelet_healthz proxy_healthz proxy_metrics cm_port sched_port
  kubelet_port=$(free_port); kubelet_healthz=$(free_port); proxy_healthz=$(free_port); proxy_metrics=$(free_port)
  cm_port=$(free_port); sched_port=$(free_port)
  # The API server listens on the node's bridge address, which pods reach through the `kubernetes` Service (the
  # injector reads its template ConfigMap so); its certificate names that Service's address too.
  # The ServiceAccount admission plugin is on, as in any cluster (pods get the bound token the kubelet projects),
  # but at 1.20, whose plugin waits for legacy token Secrets that the controller manager here does not make.
  local disabled_plugins=""
  [ "$MINOR" -ge 22 ] || disabled_plugins=ServiceAccount
  APISERVER_ADDRESS=$NODE_IP APISERVER_EXTRA_SANS="IP:$KUBERNETES_SERVICE_IP" \
  APISERVER_DISABLED_PLUGINS=$disabled_plugins \
  SERVICE_CIDR=$SERVICE_CIDR APISERVER_EXTRA_ARGS="--allow-privileged=true \
    --kubelet-client-certificate=$dir/control-plane/admin.crt --kubelet-client-key=$dir/control-plane/admin.key \
    --kubelet-preferred-address-types=InternalIP" \
    "$HERE/apiserver.sh" start "$dir/control-plane" >"$dir/logs/apiserver-start.log" 2>&1 \
    || { tail -5 "$dir/logs/apiserver-start.log" >&2; fail "the API server did not start"; }
  local cp="$dir/control-plane" kubeconfig="$dir/control-plane/kubeconfig"
  cp "$kubeconfig" "$dir/kubeconfig"
  # --port 0 (no insecure port) is the oldest's; later releases have no insecure port and no such flag.
  local insecure_port=""
  [ "$MINOR" -ge 24 ] || insecure_port="--port 0"
  # The token controller is off (no legacy token Secrets: pods get bound tokens from the kubelet); the
  # serviceaccount controller makes each namespace's `default` account, which the ServiceAccount plugin needs.
  "$BIN/kube-controller-manager" --kubeconfig "$kubeconfig" $insecure_port --secure-port "$cm_port" \
    --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials=false \
    --controllers '*,-serviceaccount-token,-nodeipam' --root-ca-file "$cp/ca.crt" >"$dir/logs/controller-manager.log" 2>&1 &
  echo "CONTROLLER_MANAGER_PID=$!" >> "$dir/node.env"
  "$BIN/kube-scheduler" --kubeconfig "$kubeconfig" $insecure_port --secure-port "$sched_port" \
    --bind-address 127.0.0.1 --leader-elect=false >"$dir/logs/scheduler.log" 2>&1 &
  echo "SCHEDULER_PID=$!" >> "$dir/node.env"

  cat > "$dir/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $kubelet_healthz
cgroupDriver: cgroupfs
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $cp/ca.crt}
authorization: {mode: Webhook}
resolvConf: $dir/resolv.conf
clusterDomain: cluster.local
# Our imported images are never collected, and a busy test machine's disk is no reason to evict.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A pod's ConfigMap volume is refreshed on its sync, every minute by default: the template tests wait for it twice,
# so the node syncs every 20 s (what a user waits is the default's, docs/operations.md).
syncFrequency: 20s
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
YAML
  # The runtime: a flag until 1.27 removed it (the endpoint moved to the configuration), and the sandbox image,
  # which later kubelets take from containerd's configuration.
  local runtime_flags="--container-runtime remote --container-runtime-endpoint unix://$sock --pod-infra-container-image $PAUSE_IMAGE"
  if [ "$MINOR" -ge 27 ]; then
    runtime_flags=""
    printf 'containerRuntimeEndpoint: unix://%s\n' "$sock" >> "$dir/kubelet/config.yaml"
  fi
  # This VM runs cgroup v1, which kubelets from 1.35 refuse unless told (they still run on it: docs/operations.md).
  [ "$MINOR" -lt 35 ] || printf 'failCgroupV1: false\n' >> "$dir/kubelet/config.yaml"
  "$BIN/kubelet" --config "$dir/kubelet/config.yaml" --kubeconfig "$kubeconfig" $runtime_flags \
    --root-dir "$dir/kubelet/root" --cert-dir "$dir/kubelet/pki" --hostname-override "$NODE_NAME" \
    --node-ip "$NODE_IP" >"$dir/logs/kubelet.log" 2>&1 &
  echo "KUBELET_PID=$!" >> "$dir/node.env"
  "$BIN/kube-proxy" --kubeconfig "$kubeconfig" --hostname-override "$NODE_NAME" --proxy-mode iptables \
    --cluster-cidr "$POD_CIDR" --healthz-bind-address "127.0.0.1:$proxy_healthz" \
    --metrics-bind-address "127.0.0.1:$proxy_metrics" --conntrack-max-per-core 0 \
    --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 >"$dir/logs/kube-proxy.log" 2>&1 &
  echo "KUBE_PROXY_PID=$!" >> "$dir/node.env"

  local ready=""
  for _ in $(seq 1 180); do
    ready=$(KUBECONFIG="$kubeconfig" kubectl get node "$NODE_NAME" \
      -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
    [ "$ready" = True ] && break
    for pid_var in CONTAINERD_PID KUBELET_PID KUBE_PROXY_PID CONTROLLER_MANAGER_PID SCHEDULER_PID; do
      local pid
      pid=$(grep "^$pid_var=" "$dir/node.env" | cut -d= -f2)
      if ! kill -0 "$pid" 2>/dev/null; then
        local name=${pid_var%_PID}
        name=$(echo "$name" | tr 'A-Z_' 'a-z-')
        tail -3 "$dir/logs/$name.log" >&2 || true
        fail "$name exited (log: $dir/logs/$name.log)"
      fi
    done
    sleep 1
  done
  if [ "$ready" != True ]; then
    grep -E '^E' "$dir/logs/kubelet.log" | tail -3 >&2 || true
    fail "node $NODE_NAME not Ready after 180 s (log: $dir/logs/kubelet.log)"
  fi
  trap - EXIT
  log "node $NODE_NAME Ready; KUBECONFIG=$dir/kubeconfig"
}

import() {
  local dir=$1 archive=$2
  [ -S "$dir/containerd/containerd.sock" ] || fail "no cluster is up in $dir"
  ctr --address "$dir/containerd/containerd.sock" -n k8s.io images import --all-platforms "$archive"
}

# --- down --------------------------------------------------------------------------------------------------------

stop_pid() {
  local pid=$1
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

down() {
  local dir=$1
  [ "$(id -u)" = 0 ] || fail "must run as root"
  # Best effort: every step runs whatever the ones before it did.
  set +e +o pipefail
  [ -d "$dir" ] || return 0
  dir="$(cd "$dir" && pwd)"
  if [ -f "$dir/node.env" ]; then
    # The kubelet and kube-proxy first (they would recreate what the rest of this removes), then containerd's
    # containers (every shim whose parent is our containerd), then containerd.
    local pid
    for name in KUBELET_PID KUBE_PROXY_PID SCHEDULER_PID CONTROLLER_MANAGER_PID; do
      pid=$(grep "^$name=" "$dir/node.env" | cut -d= -f2 || true)
      stop_pid "$pid"
    done
    for shim in $(pgrep -f "containerd-shim-runc-v2 .*-address $dir/containerd/containerd.sock" || true); do
      pkill -9 -P "$shim" 2>/dev/null || true
      kill -9 "$shim" 2>/dev/null || true
    done
    pid=$(grep "^CONTAINERD_PID=" "$dir/node.env" | cut -d= -f2 || true)
    stop_pid "$pid"
  fi
  [ -f "$dir/control-plane/env" ] && "$HERE/apiserver.sh" stop "$dir/control-plane"
  # Mounts under the cluster's directory, the netns containerd made, in reverse order (deepest first).
  local mount
  for mount in $(awk '{print $5}' /proc/self/mountinfo | grep -E "^($dir/|/run/netns/cni-|/var/run/netns/cni-)" | sort -r); do
    umount -l "$mount" 2>/dev/null || true
  done
  rm -f /run/netns/cni-* 2>/dev/null || true
  # cgroups: the kubelet's hierarchy in each controller, leaves first.
  local root
  for root in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice /sys/fs/cgroup/kubepods; do
    [ -d "$root" ] || continue
    find "$root" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  # Network: every veth on our bridge goes with it; our routes and chains; the chains kube-proxy, the kubelet and
  # the CNI plugins made (KUBE-*, CNI-*), with the rules that jump to them.
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    for veth in $(ip -o link show master "$BRIDGE" | awk -F': ' '{print $2}' | sed 's/@.*//'); do
      ip link del "$veth" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
  fi
  ip route del "$SERVICE_CIDR" 2>/dev/null || true
  local before="$dir/host-before"
  for tool in iptables ip6tables; do
    local table
    for table in filter nat mangle; do
      $tool -t "$table" -S 2>/dev/null | grep -E '^-A .*-j (KUBE-|CNI-|SIE2E-)' | sed 's/^-A/-D/' | while read -r rule; do
        eval "$tool -t $table $rule" 2>/dev/null || true
      done
      for chain in $($tool -t "$table" -S 2>/dev/null | awk '/^-N (KUBE-|CNI-|SIE2E-)/ {print $2}'); do
        $tool -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $($tool -t "$table" -S 2>/dev/null | awk '/^-N (KUBE-|CNI-|SIE2E-)/ {print $2}'); do
        # Chains that existed before the cluster (another cluster's) stay.
        grep -qx "$table :$chain" "$before/$tool" 2>/dev/null || $tool -t "$table" -X "$chain" 2>/dev/null
      done
    done
  done
  # The nftables tables iptables-nft created for the node's rules, now empty (tables that were there stay).
  if command -v nft >/dev/null; then
    nft list tables 2>/dev/null | while read -r _ family name; do
      grep -qx "table $family $name" "$before/nft-tables" 2>/dev/null || nft delete table "$family" "$name"
    done
  fi
  # sysctls back to what they were.
  if [ -f "$before/sysctls" ]; then
    while IFS=' = ' read -r key value; do
      [ "$value" = absent ] && continue
      [ "$(sysctl -n "$key" 2>/dev/null)" = "$value" ] || sysctl -qw "$key=$value" >/dev/null 2>&1 || true
    done < <(sed 's/ = /=/' "$before/sysctls" | tr '=' ' ')
  fi
  # The hard-coded paths the node created (those that were there before stay).
  for path in $HARDCODED_PATHS; do
    [ -e "$path" ] || continue
    grep -qx "$path" "$before/paths" 2>/dev/null && continue
    awk '{print $5}' /proc/self/mountinfo | grep "^$path/" | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$path"
  done
  # The state itself, but not the logs and the snapshot (the tests read them); rm fails on a missed mount.
  rm -rf "$dir/containerd" "$dir/kubelet" "$dir/cni" "$dir/control-plane/etcd" 2>/dev/null || true
  rm -f "$dir/node.env"
  log "down; the host is as it was: $(host_diff "$dir" | wc -l) differences"
}

host_diff() {
  local dir=$1
  [ -d "$dir/host-before" ] || fail "no host snapshot in $dir (was 'up' run with it?)"
  local after
  after=$(mktemp -d)
  snapshot_host "$after"
  local f
  for f in sysctls iptables ip6tables nft-tables links routes mounts paths cgroups; do
    diff "$dir/host-before/$f" "$after/$f" | grep -E '^[<>]' | sed "s|^|$f: |" || true
  done
  rm -rf "$after"
}

case "${1:-}" in
  build) build ;;
  up) up "${2:?usage: $0 up DIR}" ;;
  import) import "${2:?usage: $0 import DIR ARCHIVE}" "${3:?usage: $0 import DIR ARCHIVE}" ;;
  down) down "${2:?usage: $0 down DIR}" ;;
  host-diff) host_diff "${2:?usage: $0 host-diff DIR}" ;;
  *) echo "usage: $0 build | up DIR | import DIR ARCHIVE | down DIR | host-diff DIR" >&2; exit 2 ;;
esac
