# Test hosts for the cluster benchmarks, sourced by them: network
# namespaces on a bridge, one per host, each with a temp dir for its Prism
# node. Needs root and iproute2.
#
#   make_hosts TAG N SUBNET   # hosts $TAG-h0 .. $TAG-h(N-1), at SUBNET.1 .. SUBNET.N
#
# Sets HOSTS_TEMP (the hosts' temp dirs are $HOSTS_TEMP/h<i>) and removes
# every node, namespace and folder it made when the script exits (unless
# KEEP is set). Expects $prism, the `prism` binary.

make_hosts() {
  HOSTS_TAG="$1"
  HOSTS_N="$2"
  local subnet="$3"
  HOSTS_TEMP="$(mktemp -d /tmp/prism-hosts.XXXXXX)"
  trap remove_hosts EXIT
  [ -n "${KEEP:-}" ] && trap - EXIT
  ip netns add "$HOSTS_TAG-sw"
  ip -n "$HOSTS_TAG-sw" link add br0 type bridge
  ip -n "$HOSTS_TAG-sw" link set br0 up
  local h
  for ((h = 0; h < HOSTS_N; h++)); do
    ip netns add "$HOSTS_TAG-h$h"
    ip link add "v$HOSTS_TAG$h" netns "$HOSTS_TAG-sw" type veth peer name eth0 \
      netns "$HOSTS_TAG-h$h"
    ip -n "$HOSTS_TAG-sw" link set "v$HOSTS_TAG$h" master br0 up
    ip -n "$HOSTS_TAG-h$h" addr add "$subnet.$((h + 1))/24" dev eth0
    ip -n "$HOSTS_TAG-h$h" link set eth0 up
    ip -n "$HOSTS_TAG-h$h" link set lo up
  done
}

remove_hosts() {
  local h
  for ((h = 0; h < HOSTS_N; h++)); do
    ip netns exec "$HOSTS_TAG-h$h" "$prism" stop --force --temp-dir "$HOSTS_TEMP/h$h" \
      >/dev/null 2>&1 || true
    ip netns del "$HOSTS_TAG-h$h" 2>/dev/null || true
  done
  ip netns del "$HOSTS_TAG-sw" 2>/dev/null || true
  rm -rf "$HOSTS_TEMP"
}

# on_host H COMMAND...: runs COMMAND in host H's namespace.
on_host() {
  local h="$1"
  shift
  ip netns exec "$HOSTS_TAG-h$h" "$@"
}
