#!/usr/bin/env bash
# tests/multihost/rsh-agent.sh HOST COMMAND...: OpenMPI's remote shell for the simulated hosts of
# hosts.sh (mpirun --mca plm_rsh_agent THIS). Like ssh, it joins COMMAND into one line for a shell
# on HOST: here `sh -c` inside HOST's network, UTS and mount namespaces. Like an ssh login, the
# remote side starts from a bare environment (PATH, HOME, USER, LANG only): what the job needs must
# be forwarded with mpirun -x, as on a real cluster. FSDP_MH_PREFIX must match hosts.sh's.
# FSDP_MH_AGENT_LOG=FILE appends each launch (host and command) to FILE.
set -uo pipefail
# ssh options OpenMPI might pass (none by default for a non-ssh agent) are skipped.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
if [ $# -lt 2 ]; then
  echo "rsh-agent.sh: usage: rsh-agent.sh HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
cmd="$*"
if [ -n "${FSDP_MH_AGENT_LOG:-}" ]; then
  echo "$host: $cmd" >>"$FSDP_MH_AGENT_LOG"
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/root}" \
  USER="${USER:-root}" LANG=C.UTF-8 FSDP_MH_PREFIX="${FSDP_MH_PREFIX:-fsdpmh}" \
  "$here/hosts.sh" run "$host" /bin/sh -c "$cmd"
