#!/usr/bin/env bash
# Runs an OpenMPI job across "hosts" made of Linux network namespaces on this machine: each host
# is a namespace with its own hostname and address on a private bridge; mpirun starts one orted
# per host through an agent that enters the namespace, and the ranks talk TCP between hosts and
# shared memory inside one. Root only.
#
#   scripts/multihost.sh up HOSTS DIR        create HOSTS hosts; DIR receives the agent, the
#                                           host list and the state `down` needs
#   scripts/multihost.sh run DIR SLOTS -- COMMAND...   mpirun COMMAND on every host, SLOTS ranks
#                                           per host (N, or N,N,... per host)
#   scripts/multihost.sh kill DIR HOST [NAME]  kill every process of host HOST (1-based), or
#                                           only those called NAME (the ranks, not the orted)
#   scripts/multihost.sh stop DIR HOST      stop every process of host HOST (SIGSTOP, as a frozen
#                                           machine: its kernel still answers, its processes not)
#   scripts/multihost.sh unplug DIR HOST    take host HOST off the network (its link down, as a
#                                           pulled cable or a dead switch port: no reset is sent)
#   scripts/multihost.sh plug DIR HOST      put host HOST back on the network
#   scripts/multihost.sh cont DIR HOST      continue every process of host HOST (SIGCONT)
#   scripts/multihost.sh exec DIR HOST -- COMMAND...  run COMMAND on host HOST (its namespace and
#                                           name), without mpirun
#   scripts/multihost.sh bridge DIR         print the bridge's address (this machine, reachable
#                                           from every host)
#   scripts/multihost.sh down DIR           remove the namespaces, links and bridge
#
# Every address is in 10.231.N.0/24 (N from the process id) on the bridge the script creates;
# mpirun and the ranks are told to use that subnet only, so no traffic leaves it.
set -euo pipefail

die() {
  echo "multihost: $*" >&2
  exit 2
}

up() {
  local hosts=$1 dir=$2
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
  command -v ip >/dev/null || die "needs iproute2 (ip)"
  command -v unshare >/dev/null || die "needs util-linux (unshare)"
  mkdir -p "$dir"
  local id=$(($$ % 200 + 20))
  local tag="mt$id"
  local subnet="10.231.$id"
  echo "$tag" >"$dir/tag"
  echo "$subnet" >"$dir/subnet"
  # Namespaces of both kinds must be allowed here (containers may forbid them).
  ip netns add "${tag}probe" || die "cannot create a network namespace here"
  ip netns exec "${tag}probe" unshare --uts true || {
    ip netns del "${tag}probe"
    die "cannot create a UTS namespace here"
  }
  ip netns del "${tag}probe"
  ip link add "${tag}br" type bridge
  ip addr add "$subnet.1/24" dev "${tag}br"
  ip link set "${tag}br" up
  : >"$dir/hosts"
  for i in $(seq 1 "$hosts"); do
    local ns="${tag}h$i"
    ip netns add "$ns"
    ip link add "${tag}v$i" type veth peer name "${tag}p$i"
    ip link set "${tag}p$i" netns "$ns"
    ip link set "${tag}v$i" master "${tag}br" up
    ip -n "$ns" addr add "$subnet.$((10 + i))/24" dev "${tag}p$i"
    ip -n "$ns" link set "${tag}p$i" up
    ip -n "$ns" link set lo up
    echo "$subnet.$((10 + i)) $ns host$i" >>"$dir/hosts"
  done
  # The agent mpirun calls instead of ssh: `agent ADDRESS COMMAND...` runs COMMAND in the
  # namespace of ADDRESS, under that host's name, as ssh would run it (through a shell).
  cat >"$dir/agent" <<EOF
#!/usr/bin/env bash
address=\$1
shift
read -r _ ns name < <(grep "^\$address " "$dir/hosts")
[ -n "\$ns" ] || { echo "agent: unknown host \$address" >&2; exit 1; }
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name && \$*"
EOF
  chmod +x "$dir/agent"
}

run() {
  local dir=$1 slots=$2
  shift 2
  [ "${1:-}" = "--" ] && shift
  local subnet hostlist="" total=0 i=0
  subnet=$(cat "$dir/subnet")
  IFS=, read -r -a per_host <<<"$slots"
  while read -r address _ _; do
    local n=${per_host[$i]:-${per_host[-1]}}
    hostlist+="${hostlist:+,}$address:$n"
    total=$((total + n))
    i=$((i + 1))
  done <"$dir/hosts"
  local root=() forward=() variable
  [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
  # Remote daemons do not pass this shell's environment on: name what the ranks need.
  for variable in MESHTENSOR_TIMEOUT MESHTENSOR_CHECK_COLLECTIVES ASAN_OPTIONS UBSAN_OPTIONS \
    TSAN_OPTIONS; do
    [ -n "${!variable:-}" ] && forward+=(-x "$variable")
  done
  # A host that vanishes without a reset (unplugged, frozen) is noticed by TCP keepalives on
  # mpirun's links to the remote daemons: idle 10 s, then 3 probes 2 s apart. OpenMPI's default
  # (300 s, then 9 probes 20 s apart) leaves mpirun waiting 8 minutes for a lost daemon, even
  # after a rank called MPI_Abort.
  exec mpirun "${root[@]}" --oversubscribe -np "$total" --host "$hostlist" \
    --mca plm_rsh_agent "$dir/agent" \
    --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 2 \
    --mca oob_tcp_keepalive_probes 3 \
    --mca btl tcp,vader,self --mca btl_tcp_if_include "$subnet.0/24" --mca mpi_yield_when_idle 1 \
    --mca oob_tcp_if_include "$subnet.0/24" \
    "${forward[@]}" "$@"
}

kill_host() {  # kill_host DIR HOST [NAME]: every process of the host, or those called NAME
  local dir=$1 host=$2 name=${3:-} tag
  tag=$(cat "$dir/tag")
  local pids="" pid
  for pid in $(ip netns pids "${tag}h$host" || true); do
    if [ -z "$name" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
      pids+=" $pid"
    fi
  done
  [ -n "$pids" ] && kill -9 $pids
  echo "killed host$host: $(echo $pids | wc -w) processes${name:+ called $name}"
}

signal_host() {  # signal_host DIR HOST SIGNAL VERB: SIGNAL to every process of the host
  local dir=$1 host=$2 signal=$3 verb=$4 tag
  tag=$(cat "$dir/tag")
  local pids
  pids=$(ip netns pids "${tag}h$host" || true)
  [ -n "$pids" ] && kill "-$signal" $pids
  echo "$verb host$host: $(echo $pids | wc -w) processes"
}

unplug() {  # unplug DIR HOST: the host's link down on the bridge side
  local dir=$1 host=$2 tag
  tag=$(cat "$dir/tag")
  ip link set "${tag}v$host" down
  echo "unplugged host$host"
}

plug() {  # plug DIR HOST: the host's link up again
  local dir=$1 host=$2 tag
  tag=$(cat "$dir/tag")
  ip link set "${tag}v$host" up
  echo "plugged host$host"
}

exec_on() {  # exec_on DIR HOST -- COMMAND...: COMMAND in the host's namespace, under its name
  local dir=$1 host=$2 tag
  shift 2
  [ "${1:-}" = "--" ] && shift
  tag=$(cat "$dir/tag")
  exec ip netns exec "${tag}h$host" unshare --uts sh -c 'hostname "$0" && exec "$@"' "host$host" "$@"
}

down() {
  local dir=$1 tag
  [ -f "$dir/tag" ] || return 0
  tag=$(cat "$dir/tag")
  while read -r _ ns _; do
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done <"$dir/hosts"
  ip link del "${tag}br" 2>/dev/null || true
  for link in $(ip -o link show | sed -n "s/^[0-9]*: \(${tag}v[0-9]*\)@.*/\1/p"); do
    ip link del "$link" 2>/dev/null || true
  done
}

case ${1:-} in
up) up "$2" "$3" ;;
run)
  shift
  run "$@"
  ;;
kill) kill_host "$2" "$3" "${4:-}" ;;
stop) signal_host "$2" "$3" STOP stopped ;;
unplug) unplug "$2" "$3" ;;
plug) plug "$2" "$3" ;;
cont) signal_host "$2" "$3" CONT continued ;;
exec)
  shift
  exec_on "$@"
  ;;
bridge) echo "$(cat "$2/subnet").1" ;;
down) down "$2" ;;
*) die "usage: multihost.sh up HOSTS DIR | run DIR SLOTS -- COMMAND... | kill DIR HOST | stop DIR HOST | cont DIR HOST | unplug DIR HOST | plug DIR HOST | exec DIR HOST -- COMMAND... | bridge DIR | down DIR" ;;
esac
