#!/usr/bin/env bash
# What TLS between nodes costs: examples/cluster_bench.rs on three Prism
# nodes of one CPU each, in network namespaces of their own on a bridge
# (10.80.0.1 the head, .2 and .3), first over plain TCP, then with mutual
# TLS (--tls-cert, --tls-key, --tls-ca), in one run. The certificates are
# made here with openssl: a CA, and one certificate per node naming its IP.
#
# Needs root, iproute2 and openssl. Everything made is removed at the end.
# Prints every row for both, and TLS's time over plain's.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/prism/target}"
command -v openssl >/dev/null || {
  echo "tls_cost.sh needs openssl to make its certificates (apt-get install openssl)" >&2
  exit 1
}
cargo build -q --release -p prism-cli --bin prism
cargo build -q --release -p prism-examples --example cluster_bench

prism="$CARGO_TARGET_DIR/release/prism"
. bench/cluster/hosts.sh
make_hosts "ptl$$" 3 10.80.0
temp="$HOSTS_TEMP"

certs="$temp/certs"
mkdir -p "$certs"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$certs/ca.key" -out "$certs/ca.pem" -days 2 -subj /CN=prism-bench-ca 2>/dev/null
for h in 1 2 3; do
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$certs/$h.key" -out "$certs/$h.csr" -subj "/CN=node$h" 2>/dev/null
  printf 'subjectAltName=IP:10.80.0.%s\n' "$h" >"$certs/$h.ext"
  openssl x509 -req -in "$certs/$h.csr" -CA "$certs/ca.pem" -CAkey "$certs/ca.key" \
    -CAcreateserial -days 2 -extfile "$certs/$h.ext" -out "$certs/$h.pem" 2>/dev/null
done

# Runs the benchmark once; $1 is "plain" or "tls". Rows go to $temp/$1.rows.
run_side() {
  local side="$1" h tls
  for h in 0 1 2; do
    tls=()
    if [[ "$side" == tls ]]; then
      tls=(--tls-cert "$certs/$((h + 1)).pem" --tls-key "$certs/$((h + 1)).key"
        --tls-ca "$certs/ca.pem")
    fi
    rm -rf "$temp/$side-h$h"
    if [[ $h == 0 ]]; then
      on_host 0 "$prism" start --head --port 6380 --node-ip-address 10.80.0.1 \
        --num-cpus 1 --include-dashboard false --temp-dir "$temp/$side-h0" "${tls[@]}" >/dev/null
    else
      on_host "$h" "$prism" start --address 10.80.0.1:6380 --node-ip-address "10.80.0.$((h + 1))" \
        --num-cpus 1 --temp-dir "$temp/$side-h$h" --token "$(cat "$temp/$side-h0/token")" \
        "${tls[@]}" >/dev/null
    fi
  done
  # One heartbeat later every raylet has the others in its view.
  sleep 1.5
  on_host 0 env PRISM_ADDRESS=10.80.0.1:6380 PRISM_TEMP_DIR="$temp/$side-h0" \
    "$CARGO_TARGET_DIR/release/examples/cluster_bench" | grep '^ROW' >"$temp/$side.rows"
  for h in 2 1 0; do
    on_host "$h" "$prism" stop --temp-dir "$temp/$side-h$h" >/dev/null
  done
}
run_side plain
run_side tls

python3 bench/cluster/rows.py "$temp/plain.rows" "$temp/tls.rows" "plain TCP" TLS "TLS's cost" " time"
