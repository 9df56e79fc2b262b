#!/usr/bin/env bash
# Bring up a real, throw-away SLURM cluster (2 virtual nodes by default) on this single machine.
#
#   cluster.sh install            apt-get the Debian packages if missing (root)
#   cluster.sh up STATE_DIR       write configs, start munged, mariadbd, slurmdbd, slurmctld, N x slurmd
#   cluster.sh down STATE_DIR     stop every daemon by its pid file and wait for it to exit
#   cluster.sh status STATE_DIR   show daemons + sinfo; exit 0 only if everything is up
#
# Everything (configs, keys, databases, spools, logs, pid files, sockets) lives in STATE_DIR.
# Slurm tools find the config via SLURM_CONF; `up` prints the `export SLURM_CONF=...` line on stdout.
# Environment: ABTUNE_SLURM_NODES (virtual nodes n1..nN, default 2),
#              ABTUNE_SLURM_PORT_BASE (default 6817: ctld=base, dbd=base+2, slurmd n1..nN=base+4..base+3+N),
#              ABTUNE_SLURM_TIMEOUT (seconds for each bounded wait, default 60).
# `down` stops every slurmd the STATE_DIR ever ran; `status` checks n1..nN (use the N of `up`).
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
NEEDED_CMDS=(slurmctld slurmd slurmdbd sinfo sacct scontrol srun munged munge mariadbd mariadb-install-db mariadb)
NODE_COUNT=${ABTUNE_SLURM_NODES:-2}
[[ $NODE_COUNT =~ ^[1-9][0-9]*$ ]] || {
    echo "cluster.sh: ERROR: ABTUNE_SLURM_NODES must be a positive integer, got '$NODE_COUNT'" >&2
    exit 2
}
NODES=()
for ((i = 1; i <= NODE_COUNT; i++)); do NODES+=("n$i"); done
PARTITION=debug
CLUSTER_NAME=abtune
PORT_BASE=${ABTUNE_SLURM_PORT_BASE:-6817}
CTLD_PORT=$PORT_BASE
DBD_PORT=$((PORT_BASE + 2))
TIMEOUT=${ABTUNE_SLURM_TIMEOUT:-60}
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

# log, die, usage, wait_for
. "$(dirname "${BASH_SOURCE[0]}")/../script_helpers.sh"

# ---------------------------------------------------------------- helpers
# proc_running PID: some thread of PID is not a zombie. (A multi-threaded daemon's main thread
# shows state Z while its other threads are still shutting down, so /proc/PID/stat alone lies.)
proc_running() {
    local t st
    for t in /proc/"$1"/task/*/stat; do
        st=$(sed 's/.*) //' "$t" 2>/dev/null | cut -d' ' -f1) || continue
        [[ -n $st && $st != Z && $st != X ]] && return 0
    done
    return 1
}

# pid_alive PIDFILE COMM: true if PIDFILE names a live process whose /proc/PID/comm is COMM
# (guards against a stale pid file pointing at a recycled pid).
pid_alive() {
    local pidfile=$1 comm=$2 pid
    [[ -s $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid ]] || return 1
    [[ -r /proc/$pid/comm ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm"* ]] && proc_running "$pid"
}

# stop_pidfile NAME PIDFILE COMM: SIGTERM, bounded wait, then SIGKILL -- only that pid.
stop_pidfile() {
    local name=$1 pidfile=$2 comm=$3 pid i
    if ! pid_alive "$pidfile" "$comm"; then
        rm -f "$pidfile"
        return 0
    fi
    pid=$(tr -dc '0-9' <"$pidfile")
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 5 * TIMEOUT; i++)); do
        proc_running "$pid" || break
        sleep 0.2
    done
    if proc_running "$pid"; then
        log "$name (pid $pid) ignored SIGTERM for ${TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            proc_running "$pid" || break
            sleep 0.1
        done
        proc_running "$pid" && die "$name (pid $pid) survived SIGKILL"
    fi
    rm -f "$pidfile"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

node_port() { echo $((PORT_BASE + 4 + $1)); }

set_paths() {
    [[ -n ${1:-} ]] || usage
    STATE=$(realpath -m -- "$1")
    ETC=$STATE/etc
    MUNGE_DIR=$STATE/munge
    MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
    DB_DIR=$STATE/mysql
    DB_SOCKET=$DB_DIR/mysqld.sock
    SLURM_DIR=$STATE/slurm
    SLURMD_DIR=$STATE/slurmd
    export SLURM_CONF=$ETC/slurm.conf
    if ((${#MUNGE_SOCKET} > 100 || ${#DB_SOCKET} > 100)); then
        die "STATE_DIR path too long for unix sockets (max ~100 chars): $STATE"
    fi
}

need_root() { [[ $(id -u) == 0 ]] || die "'$1' must run as root (daemons are started as the munge/mysql/slurm users)"; }

have_packages() {
    local c
    for c in "${NEEDED_CMDS[@]}"; do command -v "$c" >/dev/null 2>&1 || return 1; done
    local u
    for u in slurm munge mysql; do id -u "$u" >/dev/null 2>&1 || return 1; done
}

# ---------------------------------------------------------------- install
cmd_install() {
    if have_packages; then
        log "packages already installed"
        return 0
    fi
    need_root install
    log "installing ${PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null ||
        die "apt-get install ${PACKAGES[*]} failed"
    have_packages || die "packages installed but some commands are still missing: ${NEEDED_CMDS[*]}"
}

# ---------------------------------------------------------------- config
write_configs() {
    local host i n
    host=$(hostname -s)
    mkdir -p "$ETC"
    chmod 755 "$ETC"
    {
        cat <<EOF
# generated by tests/slurm/cluster.sh -- single-machine test cluster
ClusterName=$CLUSTER_NAME
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s): 5, the
# least slurm accepts, so a requeue costs 6 s. A credential must reach slurmd within it: here that takes
# milliseconds (allocation to batch launch: 17 ms at most at load 8 on 2 cores), not seconds
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=5
CredType=cred/munge
StateSaveLocation=$SLURM_DIR/state
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdSpoolDir=$SLURMD_DIR/%n/spool
SlurmdPidFile=$SLURMD_DIR/%n/slurmd.pid
SlurmdLogFile=$SLURMD_DIR/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# 4 CPUs per node on a 2-core machine (study workers, 1 CPU each, next to their trial jobs): trust
# the configured counts instead of draining a node that reports fewer
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# the munge socket used for talking to slurmdbd (defaults to /run/munge/munge.socket.2, not AuthInfo)
AccountingStoragePass=$MUNGE_SOCKET
# schedule at once on submit, and re-run the scheduler every second so requeued jobs (BeginTime)
# start right after their delay instead of at the next 60 s pass
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
# requeue-friendly: jobs are requeueable by default (submitit calls scontrol requeue),
# nodes return to service on their own, and killed steps go away quickly: submitit's tasks ignore
# SIGTERM, so a step lives on until the SIGKILL KillWait seconds later. (scancel's SIGKILL comes from
# slurmd, which waits max(KillWait, 5) s, hard-coded: a cancelled job still takes 5-8 s to end.)
JobRequeue=1
ReturnToService=2
KillWait=1
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
EOF
        for i in "${!NODES[@]}"; do
            n=${NODES[$i]}
            echo "NodeName=$n NodeHostname=$n NodeAddr=127.0.0.1 Port=$(node_port "$i") CPUs=4 RealMemory=8000 State=UNKNOWN"
        done
        echo "PartitionName=$PARTITION Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
    } >"$ETC/slurm.conf.new"

    # Not used by the plugins above, but keeps slurmd from probing /etc/slurm/cgroup.conf.
    echo "CgroupPlugin=autodetect" >"$ETC/cgroup.conf"
    chmod 644 "$ETC/cgroup.conf"

    # slurmdbd.conf is looked up next to SLURM_CONF; slurmdbd insists on mode 600 owned by SlurmUser.
    local pass
    pass=$(cat "$DB_DIR/slurm.pass")
    install -m 600 -o slurm -g slurm /dev/null "$ETC/slurmdbd.conf.new"
    cat >"$ETC/slurmdbd.conf.new" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=slurm
PidFile=$SLURM_DIR/slurmdbd.pid
LogFile=$SLURM_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
EOF
    # A running cluster with a different configuration gets a clean restart.
    if ! cmp -s "$ETC/slurm.conf.new" "$ETC/slurm.conf" || ! cmp -s "$ETC/slurmdbd.conf.new" "$ETC/slurmdbd.conf"; then
        if any_running; then
            log "configuration changed: restarting the running cluster"
            cmd_down
        fi
    fi
    mv -f "$ETC/slurm.conf.new" "$ETC/slurm.conf"
    chmod 644 "$ETC/slurm.conf"
    mv -f "$ETC/slurmdbd.conf.new" "$ETC/slurmdbd.conf"
}

any_running() {
    local n
    pid_alive "$MUNGE_DIR/munged.pid" munged || pid_alive "$DB_DIR/mysqld.pid" mariadbd ||
        pid_alive "$SLURM_DIR/slurmdbd.pid" slurmdbd || pid_alive "$SLURM_DIR/slurmctld.pid" slurmctld && return 0
    for n in $(all_node_names); do pid_alive "$SLURMD_DIR/$n/slurmd.pid" slurmd && return 0; done
    return 1
}

# all_node_names: NODES plus any other node with a folder in SLURMD_DIR (an earlier `up` with more nodes)
all_node_names() {
    local d
    printf '%s\n' "${NODES[@]}"
    for d in "$SLURMD_DIR"/n*/; do
        [[ -d $d ]] && basename "$d"
    done | grep -vxF -f <(printf '%s\n' "${NODES[@]}") || true
}

prepare_dirs() {
    local n
    mkdir -p "$STATE"
    chmod 755 "$STATE"
    runuser -u slurm -- test -x "$STATE" ||
        die "STATE_DIR $STATE is not reachable by the slurm user (is a parent directory mode 0700?); use e.g. a directory under /tmp"
    install -d -m 755 -o munge -g munge "$MUNGE_DIR"
    install -d -m 755 -o mysql -g mysql "$DB_DIR"
    install -d -m 755 -o slurm -g slurm "$SLURM_DIR" "$SLURM_DIR/state"
    for n in "${NODES[@]}"; do install -d -m 755 "$SLURMD_DIR/$n" "$SLURMD_DIR/$n/spool"; done
    if [[ ! -s $MUNGE_DIR/munge.key ]]; then
        head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key"
    fi
    chown munge:munge "$MUNGE_DIR/munge.key"
    chmod 400 "$MUNGE_DIR/munge.key"
    if [[ ! -s $DB_DIR/slurm.pass ]]; then
        (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$DB_DIR/slurm.pass")
    fi
    chown root:root "$DB_DIR/slurm.pass"
    chmod 600 "$DB_DIR/slurm.pass"
}

# ---------------------------------------------------------------- daemons
start_munge() {
    local pidfile=$MUNGE_DIR/munged.pid
    if pid_alive "$pidfile" munged; then
        log "munged already running"
        return 0
    fi
    rm -f "$pidfile" "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    log "starting munged"
    runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$pidfile" --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" \
        </dev/null >>"$MUNGE_DIR/munged.out" 2>&1 ||
        die "munged failed to start; see $MUNGE_DIR/munged.log"
    wait_for "munge credential round trip" bash -c "munge -n -S '$MUNGE_SOCKET' | unmunge -S '$MUNGE_SOCKET'" ||
        die "munged not answering on $MUNGE_SOCKET; see $MUNGE_DIR/munged.log"
}

db_client() { mariadb --no-defaults --socket="$DB_SOCKET" -uroot "$@"; }

start_mariadb() {
    local pidfile=$DB_DIR/mysqld.pid data=$DB_DIR/data
    if pid_alive "$pidfile" mariadbd; then
        log "mariadbd already running"
    else
        rm -f "$pidfile" "$DB_SOCKET"
        if [[ ! -d $data/mysql ]]; then
            log "initializing MariaDB data dir $data"
            rm -rf "$data"
            mariadb-install-db --no-defaults --datadir="$data" --user=mysql \
                --auth-root-authentication-method=socket --skip-test-db \
                >"$DB_DIR/install-db.log" 2>&1 ||
                die "mariadb-install-db failed; see $DB_DIR/install-db.log"
        fi
        log "starting mariadbd"
        # mariadbd does not daemonize: run it detached in its own session.
        setsid mariadbd --no-defaults --user=mysql --datadir="$data" --socket="$DB_SOCKET" \
            --pid-file="$pidfile" --log-error="$DB_DIR/mysqld.err" --skip-networking \
            --skip-log-bin --innodb-buffer-pool-size=64M \
            </dev/null >>"$DB_DIR/mysqld.out" 2>&1 &
        wait_for "mariadbd socket" db_client -e 'SELECT 1' ||
            die "mariadbd did not come up; see $DB_DIR/mysqld.err"
        wait_for "mariadbd pid file" pid_alive "$pidfile" mariadbd || die "mariadbd wrote no pid file $pidfile"
    fi
    local pass
    pass=$(cat "$DB_DIR/slurm.pass")
    db_client -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
        ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" ||
        die "could not create the slurm database user"
}

# start_controller NAME PORT [PREFIX...]: start daemon NAME (run as PREFIX... NAME) unless its pid
# file shows it running; the caller waits for it to answer.
start_controller() {
    local name=$1 port=$2
    shift 2
    local pidfile=$SLURM_DIR/$name.pid
    if pid_alive "$pidfile" "$name"; then
        log "$name already running"
        return 0
    fi
    port_in_use "$port" && die "port $port ($name) is already in use by another process; set ABTUNE_SLURM_PORT_BASE"
    rm -f "$pidfile"
    log "starting $name"
    "$@" "$name" </dev/null >>"$SLURM_DIR/$name.out" 2>&1 ||
        die "$name failed to start; see $SLURM_DIR/$name.log"
}

start_slurmdbd() {
    # the MySQL client library finds the server's unix socket through MYSQL_UNIX_PORT
    start_controller slurmdbd "$DBD_PORT" env "MYSQL_UNIX_PORT=$DB_SOCKET"
    wait_for "slurmdbd port $DBD_PORT" port_in_use "$DBD_PORT" ||
        die "slurmdbd is not listening on $DBD_PORT; see $SLURM_DIR/slurmdbd.log"
}

start_slurmctld() {
    start_controller slurmctld "$CTLD_PORT"
    wait_for "slurmctld ping" scontrol ping || die "slurmctld not answering; see $SLURM_DIR/slurmctld.log"
}

start_slurmd() {
    local i=$1 n=${NODES[$1]} pidfile
    pidfile=$SLURMD_DIR/$n/slurmd.pid
    if pid_alive "$pidfile" slurmd; then
        log "slurmd $n already running"
        return 0
    fi
    port_in_use "$(node_port "$i")" && die "port $(node_port "$i") (slurmd $n) is already in use; set ABTUNE_SLURM_PORT_BASE"
    rm -f "$pidfile"
    log "starting slurmd $n"
    slurmd -N "$n" </dev/null >>"$SLURMD_DIR/$n/slurmd.out" 2>&1 ||
        die "slurmd $n failed to start; see $SLURMD_DIR/$n/slurmd.log"
}

nodes_idle() {
    local out n
    out=$(sinfo -h -N -p "$PARTITION" -o '%N %t') || return 1
    for n in "${NODES[@]}"; do grep -qE "^$n idle\$" <<<"$out" || return 1; done
}

# nodes_idle, and meanwhile resume nodes left DOWN/DRAINED by an earlier run (ReturnToService=2
# handles most of them; a node drained for a reason needs an explicit RESUME).
nodes_ready() {
    nodes_idle && return 0
    local bad
    bad=$(sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null | awk '$2 ~ /^(drain|drng|down)$/ {print $1}' | sort -u | paste -sd,)
    [[ -z $bad ]] || scontrol update NodeName="$bad" State=RESUME >/dev/null 2>&1 || true
    return 1
}

cmd_up() {
    local t0=$SECONDS
    need_root up
    have_packages || die "slurm/munge/mariadb not installed; run: $0 install"
    prepare_dirs
    write_configs
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurmctld
    local i
    for i in "${!NODES[@]}"; do start_slurmd "$i"; done
    wait_for "nodes ${NODES[*]} idle in partition $PARTITION" nodes_ready ||
        die "nodes not idle: $(sinfo -N -p "$PARTITION" 2>&1 | tr '\n' ';'); see $SLURMD_DIR/*/slurmd.log"
    wait_for "sacct answering" sacct -n -X -S now-1hour ||
        die "sacct does not answer; see $SLURM_DIR/slurmdbd.log and $SLURM_DIR/slurmctld.log"
    log "cluster up in $((SECONDS - t0))s (state: $STATE)"
    echo "export SLURM_CONF=$SLURM_CONF"
}

cancel_jobs() {
    pid_alive "$SLURM_DIR/slurmctld.pid" slurmctld || return 0
    local jobs
    jobs=$(squeue -h -o '%i' 2>/dev/null | tr '\n' ' ') || return 0
    [[ -n ${jobs// /} ]] || return 0
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    wait_for "jobs to end" bash -c "out=\$(squeue -h -o %i) && [[ -z \$out ]]" ||
        log "some jobs still present: $(squeue -h 2>/dev/null | tr '\n' ';')"
}

# slurmstepd processes of this cluster (found by the SLURM_CONF in their environment) that outlive slurmd
stray_stepds() {
    local p
    for p in /proc/[0-9]*; do
        [[ $(cat "$p/comm" 2>/dev/null) == slurmstepd ]] || continue
        tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF" && echo "${p#/proc/}"
    done
    return 0
}

cmd_down() {
    need_root down
    [[ -d $STATE ]] || {
        log "no state dir $STATE; nothing to stop"
        return 0
    }
    cancel_jobs
    local n pid
    # every node this state dir ever ran, whatever ABTUNE_SLURM_NODES says now
    for n in $(all_node_names); do stop_pidfile "slurmd $n" "$SLURMD_DIR/$n/slurmd.pid" slurmd; done
    for pid in $(stray_stepds); do
        log "killing leftover slurmstepd pid $pid"
        kill -KILL "$pid" 2>/dev/null || true
    done
    stop_pidfile slurmctld "$SLURM_DIR/slurmctld.pid" slurmctld
    stop_pidfile slurmdbd "$SLURM_DIR/slurmdbd.pid" slurmdbd
    stop_pidfile mariadbd "$DB_DIR/mysqld.pid" mariadbd
    stop_pidfile munged "$MUNGE_DIR/munged.pid" munged
    log "cluster down (state kept in $STATE)"
}

cmd_status() {
    local ok=0 n
    check() {
        if pid_alive "$2" "$3"; then
            printf '%-12s running (pid %s)\n' "$1" "$(tr -dc '0-9' <"$2")"
        else
            printf '%-12s stopped\n' "$1"
            ok=1
        fi
    }
    check munged "$MUNGE_DIR/munged.pid" munged
    check mariadbd "$DB_DIR/mysqld.pid" mariadbd
    check slurmdbd "$SLURM_DIR/slurmdbd.pid" slurmdbd
    check slurmctld "$SLURM_DIR/slurmctld.pid" slurmctld
    for n in "${NODES[@]}"; do check "slurmd $n" "$SLURMD_DIR/$n/slurmd.pid" slurmd; done
    if ((ok == 0)); then
        sinfo -N -p "$PARTITION" || ok=1
        nodes_idle || echo "(nodes not all idle)"
    fi
    echo "export SLURM_CONF=$SLURM_CONF"
    return $ok
}

case "${1:-}" in
install) cmd_install ;;
up) set_paths "${2:-}" && cmd_up ;;
down) set_paths "${2:-}" && cmd_down ;;
status) set_paths "${2:-}" && cmd_status ;;
*) usage ;;
esac
