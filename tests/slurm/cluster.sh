#!/usr/bin/env bash
# A real two-node Slurm on this one machine, for the HPC tests (make test-slurm):
# Debian's slurmctld and two slurmd (nodes n1 and n2, each on its own port), no
# systemd, all state, logs and configuration under DIR. Authentication is
# munge's, with a munged of our own (its key and socket in DIR): the daemons
# listen on every interface, as Slurm's do, and accept only holders of that key.
# The cluster lives as long as the tests.
#
#   bash tests/slurm/cluster.sh start DIR   # prints: export SLURM_CONF=DIR/slurm.conf
#   bash tests/slurm/cluster.sh stop DIR
#
# `start` installs the packages with apt-get when sbatch is missing (as root), and
# returns once both nodes are idle; it fails (status 1, the logs' tails on stderr)
# if they are not within 60 s.
set -euo pipefail

ACTION=${1:?"usage: cluster.sh start|stop DIR"}
DIR=$(mkdir -p "${2:?"usage: cluster.sh start|stop DIR"}" && cd "$2" && pwd)
export SLURM_CONF=$DIR/slurm.conf

stop() {  # the jobs first (their steps outlive slurmd), then the daemons started here
    if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
        scancel --user "$(id -un)" 2>/dev/null || true
        for _ in $(seq 20); do
            [ -z "$(squeue -h 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    local pids=()
    for file in "$DIR"/*.pid; do
        [ -f "$file" ] && pids+=("$(cat "$file")")
    done
    if [ ${#pids[@]} -gt 0 ]; then
        kill "${pids[@]}" 2>/dev/null || true
        for _ in $(seq 20); do
            kill -0 "${pids[@]}" 2>/dev/null || break
            sleep 0.5
        done
        kill -9 "${pids[@]}" 2>/dev/null || true
    fi
    rm -f "$DIR"/*.pid
}

if [ "$ACTION" = stop ]; then
    stop
    exit 0
fi
[ "$ACTION" = start ] || { echo "cluster.sh: start or stop, not '$ACTION'" >&2; exit 2; }

if ! command -v sbatch >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v munged >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        slurmctld slurmd slurm-client munge >/dev/null
fi

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
HOST=$(hostname -s)
CPUS=$(nproc)
mkdir -p "$DIR/state" "$DIR/spool/n1" "$DIR/spool/n2"
cat > "$SLURM_CONF" <<CONF
ClusterName=srcdaskci
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$(port)
SlurmUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.daemon
SlurmdPidFile=$DIR/slurmd-%n.daemon
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
JobCompType=jobcomp/none
NodeName=n1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$(port) CPUs=$CPUS RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$(port) CPUs=$CPUS RealMemory=4000 State=UNKNOWN
PartitionName=ci Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF

stop
rm -f "$DIR/munge.key"
mungekey --create --keyfile "$DIR/munge.key"
munged --force --socket "$DIR/munge.socket" --key-file "$DIR/munge.key" \
    --pid-file "$DIR/munged.pid" --log-file "$DIR/munged.log" --seed-file "$DIR/munged.seed"
# in the foreground (-D) behind &, so that their pids are ours to stop; -c: no state
# of an earlier cluster in DIR (its jobs) comes back
slurmctld -D -c -i >/dev/null 2>&1 &
echo $! > "$DIR/slurmctld.pid"
for node in n1 n2; do
    slurmd -D -N "$node" >/dev/null 2>&1 &
    echo $! > "$DIR/slurmd-$node.pid"
done
for _ in $(seq 60); do
    if [ "$(sinfo -h -o '%T' 2>/dev/null | sort -u)" = idle ]; then
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 1
done
echo "cluster.sh: the nodes are not idle after 60 s:" >&2
sinfo >&2 || true
tail -n 20 "$DIR"/*.log >&2 || true
stop
exit 1
