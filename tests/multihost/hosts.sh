#!/usr/bin/env bash
# tests/multihost/hosts.sh: simulated hosts on this machine, for MPI jobs that cross real host
# boundaries (own network stack, own hostname, TCP between them). Root only.
#
#   hosts.sh up [N]            creates hosts h1..hN (N = 2 or 3, default 2)
#   hosts.sh down              removes everything `up` made; safe on a partial set-up, repeatable
#   hosts.sh run HOST CMD...   runs CMD on HOST (its network, hostname and /etc/hosts), same cwd
#   hosts.sh status            what exists now
#
# Host hK is:
#   - network namespace  PREFIX-hK: loopback up, eth0 = 10.77.0.K/24 (FSDP_MH_SUBNET), and no
#     route but the subnet's own: no default route, nothing leaves these namespaces;
#   - a sleeper process (`sleep infinity` started by `unshare --uts --mount`) whose UTS namespace
#     holds the hostname hK and whose own mount namespace has the test's hosts file bound over
#     /etc/hosts (h1..hN -> their addresses), so OpenMPI resolves the names inside the hosts while
#     the machine's own /etc/hosts is never touched. That mount namespace is a slave of the
#     root's: mounts made outside still appear in it (/run/netns/*, which the rsh agent enters
#     from inside h1), the /etc/hosts bind does not leak out.
# The hosts' eth0 are veth pairs whose other ends sit on bridge br0 in namespace PREFIX-sw (the
# switch). Nothing is created in the root network namespace. State (hosts file, sleeper PIDs) is
# kept in /run/PREFIX. PREFIX is $FSDP_MH_PREFIX, default fsdpmh.
#
# Exit codes: 0; 1 set-up failed (what was made is removed again); 2 refused or usage; 3 not
# possible on this machine (not root, tools or namespaces missing).
# `up` refuses to start (exit 2, one message) when any of these names already exists: a test
# still running, or one that was killed before cleaning up (then `hosts.sh down` removes it).
# A failure half-way through `up` removes what it made. `down` also ends the processes still
# running inside the hosts' network namespaces (orted and ranks of a timed-out job), by PID.
set -uo pipefail

PREFIX=${FSDP_MH_PREFIX:-fsdpmh}
SUBNET=${FSDP_MH_SUBNET:-10.77.0}  # first three octets of a /24 private to these namespaces
STATE=/run/$PREFIX
SW=$PREFIX-sw

die() {
  echo "hosts.sh: $*" >&2
  exit 2
}
# Not possible on this machine (not root, no tools, no namespaces): exit 3, which a test skips.
unable() {
  echo "hosts.sh: $*" >&2
  exit 3
}

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }

# The sleeper of host $1, checked to still be ours (a recycled PID must not be entered or killed).
sleeper_pid() {
  local f=$STATE/$1.pid pid
  [ -r "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = sleep ] || return 1
  tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | grep -q "^sleep infinity" || return 1
  echo "$pid"
}

cmd_down() {
  local ns pid h
  # Processes still inside the hosts' network stacks are this test's (orted, ranks): end them.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(h[0-9]+|sw)\$"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [ "$pid" != "$$" ] && kill -KILL "$pid" 2>/dev/null
    done
  done
  if [ -d "$STATE" ]; then
    for f in "$STATE"/h*.pid; do
      [ -e "$f" ] || continue
      h=$(basename "$f" .pid)
      if pid=$(sleeper_pid "$h"); then
        kill -KILL "$pid" 2>/dev/null
      fi
    done
  fi
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(h[0-9]+|sw)\$"); do
    ip netns del "$ns" 2>/dev/null || echo "hosts.sh: could not delete netns $ns" >&2
  done
  rm -rf "$STATE"
  return 0
}

cmd_up() {
  local n=${1:-2} k h ns pid i
  case "$n" in 2 | 3) ;; *) die "up takes 2 or 3 hosts, not '$n'" ;; esac
  [ "$(id -u)" -eq 0 ] || unable "needs root (network namespaces)"
  for tool in ip unshare nsenter; do
    command -v "$tool" >/dev/null || unable "'$tool' not found (Debian packages iproute2, util-linux)"
  done
  unshare --net --uts --mount true 2>/dev/null || unable "cannot create network/UTS/mount namespaces here"
  # Refuse to touch anything that exists already.
  for ns in "$SW" $(for k in $(seq 1 "$n"); do echo "$PREFIX-h$k"; done); do
    ns_exists "$ns" && die "network namespace '$ns' already exists (another multihost test running, or one killed" \
      "before its cleanup: if none is running, 'tests/multihost/hosts.sh down' removes it; FSDP_MH_PREFIX picks other names)"
  done
  [ -e "$STATE" ] && die "$STATE already exists (another multihost test running, or a stale one: 'tests/multihost/hosts.sh down')"

  # From here on, any failure removes what was made.
  mkdir -p "$STATE" || die "cannot create $STATE"
  trap 'echo "hosts.sh: set-up failed at line $LINENO; removing what was made" >&2; cmd_down; exit 1' ERR
  set -E
  {
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    for k in $(seq 1 "$n"); do echo "$SUBNET.$k h$k"; done
  } >"$STATE/hosts"
  echo "$n" >"$STATE/nhosts"

  ip netns add "$SW"
  ip -n "$SW" link set lo up
  ip -n "$SW" link add br0 type bridge
  ip -n "$SW" link set br0 up
  for k in $(seq 1 "$n"); do
    h=h$k ns=$PREFIX-$h
    ip netns add "$ns"
    ip -n "$SW" link add "$h" type veth peer name eth0 netns "$ns"
    ip -n "$SW" link set "$h" master br0
    ip -n "$SW" link set "$h" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$SUBNET.$k/24" dev eth0
    ip -n "$ns" link set eth0 up
    # IPv4 only on the test link: no link-local IPv6 addresses for MPI to consider.
    nsenter --net=/run/netns/"$ns" sysctl -qw net.ipv6.conf.eth0.disable_ipv6=1 >/dev/null 2>&1 || true
  done

  # The sleepers, after every netns exists: their mount namespaces are slaves of the root's, so
  # /run/netns/* stays enterable from inside a host (mpirun on h1 runs the agent for h2 there).
  for k in $(seq 1 "$n"); do
    h=h$k
    # The sleeper: its own hostname and its own /etc/hosts. No fork: the PID is the sleep's.
    unshare --uts --mount --propagation slave -- /bin/sh -c \
      'hostname "$1" && mount --bind "$2" /etc/hosts && exec sleep infinity' sh "$h" "$STATE/hosts" \
      </dev/null >/dev/null 2>&1 &
    pid=$!
    echo "$pid" >"$STATE/$h.pid"
    for i in $(seq 1 100); do
      sleeper_pid "$h" >/dev/null && break
      kill -0 "$pid" 2>/dev/null || { echo "hosts.sh: the sleeper of $h exited" >&2; false; }
      sleep 0.05
    done
    sleeper_pid "$h" >/dev/null || { echo "hosts.sh: the sleeper of $h did not start" >&2; false; }
    [ "$(nsenter --uts=/proc/"$pid"/ns/uts hostname)" = "$h" ] ||
      { echo "hosts.sh: hostname of $h not set" >&2; false; }
  done

  # Isolation: no host has a route off the test subnet.
  for k in $(seq 1 "$n"); do
    ip -n "$PREFIX-h$k" route | grep -q "^default" && { echo "hosts.sh: h$k has a default route" >&2; false; }
  done
  trap - ERR
  echo "hosts.sh: up: $(for k in $(seq 1 "$n"); do printf 'h%s=%s.%s ' "$k" "$SUBNET" "$k"; done)(netns $PREFIX-h*, bridge in $SW, state $STATE)"
}

cmd_run() {
  [ $# -ge 2 ] || die "usage: hosts.sh run HOST CMD..."
  local h=$1 pid
  shift
  ns_exists "$PREFIX-$h" || die "no host '$h' (network namespace $PREFIX-$h missing; run 'hosts.sh up' first)"
  pid=$(sleeper_pid "$h") || die "the sleeper holding $h's hostname is gone"
  # --root: entering a mount namespace moves the root to the namespace's own; inside a chroot (a
  # container, tests/fresh_machine.sh) that is the host's /, so keep the sleeper's root instead.
  exec nsenter --net=/run/netns/"$PREFIX-$h" --uts=/proc/"$pid"/ns/uts --mount=/proc/"$pid"/ns/mnt \
    --root=/proc/"$pid"/root --wd="$PWD" -- "$@"
}

cmd_status() {
  echo "state $STATE: $([ -d "$STATE" ] && ls "$STATE" | tr '\n' ' ' || echo none)"
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-" | while read -r ns; do
    echo "netns $ns: $(ip -n "$ns" -br -4 addr | awk '$1!="lo"{print $1, $3}' | tr '\n' ' ')"
  done
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  run) shift; cmd_run "$@" ;;
  status) cmd_status ;;
  *) die "usage: hosts.sh up [2|3] | down | run HOST CMD... | status" ;;
esac
