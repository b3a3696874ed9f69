#!/usr/bin/env bash
# A small cluster on this machine, for tests and for trying a multi-node run by hand: K hosts, each a
# network namespace with its own address and link to a switch (a bridge in a namespace of its own),
# its own host name (a UTS namespace for what runs there) and the others' names in its /etc/hosts.
# Nothing outside the namespaces is touched: their addresses (10.213.N.0/24) route nowhere else.
# Needs root, iproute2 (ip, tc) and util-linux (unshare).
#   scripts/hosts.sh up K [--link-mbit X] [--prefix P]   K hosts P0..P(K-1) (P: sbhost), links shaped to X Mbit/s
#                                                        each way (tc tbf) when given; an earlier cluster of P
#                                                        is removed first
#   scripts/hosts.sh down [--prefix P]                   remove them (every namespace and file of P)
#   scripts/hosts.sh run I [--prefix P] -- CMD ARGS...   CMD on host I, as host P<I> (its exit status)
#   scripts/hosts.sh link I up|down [--prefix P]         set host I's link up or down (down drops packets:
#                                                        connections go silent, no reset)
#   scripts/hosts.sh shape I MBIT|off [--prefix P]       shape host I's link both ways, or not
#   scripts/hosts.sh addr I [--prefix P]                 host I's address
# Exit: 0 done; 1 a command failed (its message on stderr); 2 a usage error.
set -uo pipefail

usage() {
  sed -n '2,17p' "${BASH_SOURCE[0]}" >&2
  exit 2
}
die() {
  echo "hosts.sh: $*" >&2
  exit 1
}

[ $# -ge 1 ] || usage
cmd=$1
shift
prefix=sbhost
mbit=""
pos=()
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
    --link-mbit) [ $# -ge 2 ] || usage; mbit=$2; shift 2 ;;
    --) shift; break ;;
    *) pos+=("$1"); shift ;;
  esac
done
[[ $prefix =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "hosts.sh: --prefix $prefix: 1 to 8 lowercase letters and digits, a letter first" >&2; exit 2; }
switch=${prefix}sw
# the third octet from the prefix, so that two clusters of different prefixes never share addresses
octet=$(($(printf '%s' "$prefix" | cksum | cut -d' ' -f1) % 250 + 1))
[ "$prefix" = sbhost ] && octet=0
addr() { echo "10.213.$octet.$(($1 + 1))"; }

[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces); run it as root"
command -v ip > /dev/null && command -v tc > /dev/null || die "needs iproute2 (ip, tc): apt-get install iproute2"
command -v unshare > /dev/null || die "needs unshare (util-linux)"

hosts() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" | sort -V; }

down() {
  local h
  for h in $(hosts) $switch; do
    ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$h" 2>/dev/null
    rm -rf "/etc/netns/$h"
  done
  rm -rf /etc/netns/"${prefix}"[0-9]*
  return 0
}

# tc tbf on both ends of host i's link: its own egress, and the switch's port towards it
shape() {
  local i=$1 rate=$2 h=$prefix$1
  for where in "$h eth0" "$switch p$i"; do
    set -- $where
    ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null
    if [ "$rate" != off ]; then
      # a burst of at least 10 ms at the rate (and a 1500-byte frame), a queue of 100 ms
      local burst=$((rate * 1000000 / 8 / 100))
      [ $burst -lt 15000 ] && burst=15000
      ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${rate}mbit" burst "$burst" latency 100ms ||
        die "tc tbf on $1 $2 failed"
    fi
  done
}

number() { [[ $1 =~ ^[0-9]+$ ]] || { echo "hosts.sh: '$1' is not a host number" >&2; exit 2; }; }
exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$prefix$1" || die "no host $prefix$1 (scripts/hosts.sh up K first)"; }

case $cmd in
  up)
    [ ${#pos[@]} -eq 1 ] || usage
    k=${pos[0]}
    number "$k"
    [ "$k" -ge 1 ] && [ "$k" -le 64 ] || { echo "hosts.sh: up $k: 1 to 64 hosts" >&2; exit 2; }
    [ -z "$mbit" ] || [[ $mbit =~ ^[0-9]+$ && $mbit -ge 1 ]] || { echo "hosts.sh: --link-mbit $mbit: a whole number of Mbit/s" >&2; exit 2; }
    down
    trap 'down; exit 1' ERR INT TERM  # a cluster half made is removed
    set -E -e
    ip netns add "$switch"
    ip netns exec "$switch" ip link set lo up
    ip netns exec "$switch" ip link add br0 type bridge
    ip netns exec "$switch" ip link set br0 up
    hosts_file="127.0.0.1 localhost"$'\n'
    for ((i = 0; i < k; i++)); do hosts_file+="$(addr "$i") $prefix$i"$'\n'; done
    for ((i = 0; i < k; i++)); do
      h=$prefix$i
      ip netns add "$h"
      mkdir -p "/etc/netns/$h"
      printf '%s' "$hosts_file" > "/etc/netns/$h/hosts"
      ip netns exec "$h" ip link set lo up
      ip link add "${prefix}v$i" type veth peer name "${prefix}p$i"
      ip link set "${prefix}v$i" netns "$h"
      ip link set "${prefix}p$i" netns "$switch"
      ip netns exec "$h" ip link set "${prefix}v$i" name eth0
      ip netns exec "$switch" ip link set "${prefix}p$i" name "p$i"
      ip netns exec "$switch" ip link set "p$i" master br0 up
      ip netns exec "$h" ip addr add "$(addr "$i")/24" dev eth0
      ip netns exec "$h" ip link set eth0 up
      [ -n "$mbit" ] && shape "$i" "$mbit"
    done
    set +E +e
    trap - ERR INT TERM
    echo "hosts.sh: $k hosts up: $(for ((i = 0; i < k; i++)); do printf '%s=%s ' "$prefix$i" "$(addr "$i")"; done)${mbit:+links $mbit Mbit/s}"
    ;;
  down)
    [ ${#pos[@]} -eq 0 ] || usage
    down
    ;;
  run)
    [ ${#pos[@]} -eq 1 ] && [ $# -ge 1 ] || usage
    number "${pos[0]}"
    exists "${pos[0]}"
    h=$prefix${pos[0]}
    exec ip netns exec "$h" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
    ;;
  link)
    [ ${#pos[@]} -eq 2 ] || usage
    number "${pos[0]}"
    exists "${pos[0]}"
    case ${pos[1]} in up|down) ;; *) usage ;; esac
    ip netns exec "$prefix${pos[0]}" ip link set eth0 "${pos[1]}" || die "link ${pos[1]} failed"
    ;;
  shape)
    [ ${#pos[@]} -eq 2 ] || usage
    number "${pos[0]}"
    exists "${pos[0]}"
    [ "${pos[1]}" = off ] || [[ ${pos[1]} =~ ^[0-9]+$ && ${pos[1]} -ge 1 ]] || usage
    shape "${pos[0]}" "${pos[1]}"
    ;;
  addr)
    [ ${#pos[@]} -eq 1 ] || usage
    number "${pos[0]}"
    addr "${pos[0]}"
    ;;
  *) usage ;;
esac
