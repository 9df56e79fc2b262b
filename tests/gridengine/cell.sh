#!/usr/bin/env bash
# Bring up a real, throw-away Grid Engine cell (one master, one exec host) on this single machine.
#
#   cell.sh install            apt-get the Debian packages if missing (root)
#   cell.sh up STATE_DIR       write the cell, start sge_qmaster and sge_execd, configure queue all.q and PE smp
#   cell.sh down STATE_DIR     delete every job, stop both daemons by their pid files and wait for them to exit
#   cell.sh status STATE_DIR   show the daemons and the queue; exit 0 only if a job could run
#
# Everything (SGE_ROOT, cell, spools, logs, pid files, accounting) lives in STATE_DIR; the packages'
# own cell (/var/lib/gridengine/default) is neither used nor started. The tools find the cell through
# SGE_ROOT, SGE_CELL, SGE_QMASTER_PORT and SGE_EXECD_PORT: `up` prints the `export ...` line on stdout
# and writes it to STATE_DIR/env.sh.
# Environment: ABTUNE_SGE_PORT_BASE (default 6744: qmaster on base, execd on base+1),
#              ABTUNE_SGE_SLOTS (slots of the one queue instance, default 4),
#              ABTUNE_SGE_TIMEOUT (seconds for each bounded wait, default 60).
set -euo pipefail

PACKAGES=(gridengine-master gridengine-exec gridengine-client)
NEEDED_CMDS=(sge_qmaster sge_execd qsub qstat qdel qconf qacct)
CELL=abtune
HOST=localhost # the name the cell knows this machine by (host_aliases maps `hostname` to it)
QUEUE=all.q
PE=smp
SLOTS=${ABTUNE_SGE_SLOTS:-4}
PORT_BASE=${ABTUNE_SGE_PORT_BASE:-6744}
TIMEOUT=${ABTUNE_SGE_TIMEOUT:-60}
SHARE=/usr/share/gridengine
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

# log, die, usage, wait_for
. "$(dirname "${BASH_SOURCE[0]}")/../script_helpers.sh"

# pid_alive PIDFILE COMM: PIDFILE names a live (not zombie) process whose /proc/PID/comm is COMM.
pid_alive() {
    local pidfile=$1 comm=$2 pid st
    [[ -s $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm"* ]] || return 1
    st=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
    [[ -n $st && $st != Z && $st != X ]]
}

# stop_pidfile PIDFILE COMM: SIGTERM, bounded wait, then SIGKILL -- only that pid.
stop_pidfile() {
    local pidfile=$1 comm=$2 pid
    pid_alive "$pidfile" "$comm" || return 0
    pid=$(tr -dc '0-9' <"$pidfile")
    log "stopping $comm (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_for "$comm (pid $pid) to exit" pid_gone "$pidfile" "$comm"; then
        log "$comm (pid $pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

pid_gone() { ! pid_alive "$@"; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

set_paths() {
    [[ -n ${1:-} ]] || usage
    STATE=$(realpath -m -- "$1")
    export SGE_ROOT=$STATE/root SGE_CELL=$CELL SGE_QMASTER_PORT=$PORT_BASE SGE_EXECD_PORT=$((PORT_BASE + 1))
    COMMON=$SGE_ROOT/$CELL/common
    QMASTER_SPOOL=$STATE/spool/qmaster
    EXECD_SPOOL=$STATE/spool/execd
    QMASTER_PID=$QMASTER_SPOOL/qmaster.pid
    EXECD_PID=$EXECD_SPOOL/$HOST/execd.pid
}

need_root() { [[ $(id -u) == 0 ]] || die "'$1' must run as root (the daemons start as root and run as sgeadmin)"; }

have_packages() {
    local c
    for c in "${NEEDED_CMDS[@]}"; do command -v "$c" >/dev/null 2>&1 || return 1; done
    id -u sgeadmin >/dev/null 2>&1
}

cmd_install() {
    if have_packages; then
        log "packages already installed"
        return 0
    fi
    need_root install
    log "installing ${PACKAGES[*]}"
    # The packages would ask for a master host and offer to create their own cell: this script makes its own.
    debconf-set-selections <<EOF
gridengine-common shared/gridenginemaster string $HOST
gridengine-common shared/gridenginecell string default
gridengine-common shared/gridengineconfig boolean false
EOF
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null ||
        die "apt-get install ${PACKAGES[*]} failed"
    have_packages || die "packages installed but some commands are still missing: ${NEEDED_CMDS[*]}"
}

# A new cell: SGE_ROOT links the packages' binaries, the cell's common/ and a classic (flat file) spool.
create_cell() {
    [[ -s $COMMON/configuration ]] && return 0
    log "creating cell $CELL in $SGE_ROOT"
    mkdir -p "$SGE_ROOT" "$COMMON" "$STATE/conf"
    local d
    for d in bin lib utilbin; do ln -sfn "/var/lib/gridengine/$d" "$SGE_ROOT/$d"; done
    ln -sfn "$SHARE/util" "$SGE_ROOT/util"
    cat >"$COMMON/bootstrap" <<EOF
admin_user              sgeadmin
default_domain          none
ignore_fqdn             true
spooling_method         classic
spooling_lib            libspoolc
spooling_params         $COMMON;$QMASTER_SPOOL
binary_path             /usr/sbin
qmaster_spool_dir       $QMASTER_SPOOL
security_mode           none
listener_threads        2
worker_threads          2
scheduler_threads       1
EOF
    echo "$HOST" >"$COMMON/act_qmaster"
    # Every name this machine answers to is the one host $HOST (gethostname says `vm`, 127.0.0.1 says localhost).
    echo "$HOST $(hostname) $(hostname -f 2>/dev/null || true)" | tr -s ' ' >"$COMMON/host_aliases"
    # Jobs as root (the suite runs as root), accounting written within a second, no mail.
    sed -e "s|^execd_spool_dir .*|execd_spool_dir $EXECD_SPOOL|" \
        -e 's/^min_uid .*/min_uid 0/' -e 's/^min_gid .*/min_gid 0/' \
        -e 's|^mailer .*|mailer /bin/true|' \
        -e 's/^execd_params .*/execd_params ENABLE_ADDGRP_KILL=true/' \
        -e 's/^reporting_params .*/reporting_params accounting=true reporting=false flush_time=00:00:01 joblog=false sharelog=00:00:00/' \
        "$SHARE/default-configuration" >"$STATE/conf/global"
    install -d -o sgeadmin -g sgeadmin "$STATE/spool" "$QMASTER_SPOOL" "$EXECD_SPOOL"
    /usr/lib/gridengine/spoolinit classic libspoolc "$COMMON;$QMASTER_SPOOL" init >/dev/null
    /usr/lib/gridengine/spooldefaults configuration "$STATE/conf/global"
    /usr/lib/gridengine/spooldefaults complexes "$SHARE/util/resources/centry"
    /usr/lib/gridengine/spooldefaults usersets "$SHARE/util/resources/usersets"
    /usr/lib/gridengine/spooldefaults managers sgeadmin root
    /usr/lib/gridengine/spooldefaults adminhosts "$HOST"
    chown -R sgeadmin:sgeadmin "$SGE_ROOT/$CELL" "$STATE/spool"
}

start_qmaster() {
    if pid_alive "$QMASTER_PID" sge_qmaster; then
        log "sge_qmaster already running"
        return 0
    fi
    port_in_use "$SGE_QMASTER_PORT" && die "port $SGE_QMASTER_PORT (sge_qmaster) is in use; set ABTUNE_SGE_PORT_BASE"
    log "starting sge_qmaster"
    (cd / && sge_qmaster </dev/null >>"$STATE/qmaster.out" 2>&1) ||
        die "sge_qmaster failed to start; see $QMASTER_SPOOL/messages"
    wait_for "sge_qmaster to answer" qconf -sh || die "sge_qmaster not answering; see $QMASTER_SPOOL/messages"
}

# The cell's objects, once: this host as submit and exec host, a fast scheduler, PE smp and queue all.q.
configure_cell() {
    [[ -e $STATE/conf/configured ]] && return 0
    log "configuring queue $QUEUE ($SLOTS slots) and parallel environment $PE"
    qconf -as "$HOST" >/dev/null
    cat >"$STATE/conf/exechost" <<EOF
hostname $HOST
load_scaling NONE
complex_values NONE
user_lists NONE
xuser_lists NONE
projects NONE
xprojects NONE
usage_scaling NONE
report_variables NONE
EOF
    qconf -Ae "$STATE/conf/exechost" >/dev/null
    # Schedule every second (default 15 s) and ignore the load of a machine the other tests keep busy.
    qconf -ssconf | sed -e 's/^schedule_interval .*/schedule_interval 0:0:1/' \
        -e 's/^flush_submit_sec .*/flush_submit_sec 1/' -e 's/^flush_finish_sec .*/flush_finish_sec 1/' \
        -e 's/^job_load_adjustments .*/job_load_adjustments NONE/' \
        -e 's/^load_adjustment_decay_time .*/load_adjustment_decay_time 0:0:0/' >"$STATE/conf/scheduler"
    qconf -Msconf "$STATE/conf/scheduler" >/dev/null
    cat >"$STATE/conf/pe" <<EOF
pe_name            $PE
slots              9999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    \$fill_up
control_slaves     TRUE
job_is_first_task  TRUE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
EOF
    qconf -Ap "$STATE/conf/pe" >/dev/null
    cat >"$STATE/conf/queue" <<EOF
qname                 $QUEUE
hostlist              $HOST
seq_no                0
load_thresholds       NONE
suspend_thresholds    NONE
nsuspend              1
suspend_interval      00:05:00
priority              0
min_cpu_interval      00:05:00
processors            UNDEFINED
qtype                 BATCH INTERACTIVE
ckpt_list             NONE
pe_list               $PE
rerun                 FALSE
slots                 $SLOTS
tmpdir                /tmp
shell                 /bin/bash
prolog                NONE
epilog                NONE
shell_start_mode      posix_compliant
starter_method        NONE
suspend_method        NONE
resume_method         NONE
terminate_method      NONE
notify                00:00:60
owner_list            NONE
user_lists            NONE
xuser_lists           NONE
subordinate_list      NONE
complex_values        NONE
projects              NONE
xprojects             NONE
calendar              NONE
initial_state         default
s_rt                  INFINITY
h_rt                  INFINITY
s_cpu                 INFINITY
h_cpu                 INFINITY
s_fsize               INFINITY
h_fsize               INFINITY
s_data                INFINITY
h_data                INFINITY
s_stack               INFINITY
h_stack               INFINITY
s_core                INFINITY
h_core                INFINITY
s_rss                 INFINITY
h_rss                 INFINITY
s_vmem                INFINITY
h_vmem                INFINITY
EOF
    qconf -Aq "$STATE/conf/queue" >/dev/null
    touch "$STATE/conf/configured"
}

start_execd() {
    if pid_alive "$EXECD_PID" sge_execd; then
        log "sge_execd already running"
    else
        port_in_use "$SGE_EXECD_PORT" && die "port $SGE_EXECD_PORT (sge_execd) is in use; set ABTUNE_SGE_PORT_BASE"
        log "starting sge_execd"
        (cd / && sge_execd </dev/null >>"$STATE/execd.out" 2>&1) ||
            die "sge_execd failed to start; see $EXECD_SPOOL/$HOST/messages"
    fi
    wait_for "queue $QUEUE@$HOST to take jobs" queue_open ||
        die "$QUEUE@$HOST never took jobs (qstat -f: $(qstat -f | grep "^$QUEUE@" || true)); see $EXECD_SPOOL/$HOST/messages"
}

# queue_open: the queue instance has a load report and no state (au, E, d, ...) that keeps jobs off it.
queue_open() { qstat -f -q "$QUEUE" | awk -v q="$QUEUE@$HOST" '$1 == q { found = 1; ok = (NF == 5) } END { exit !(found && ok) }'; }

queue_empty() { [[ -z $(qstat -u '*') ]]; }

env_line() { echo "export SGE_ROOT=$SGE_ROOT SGE_CELL=$SGE_CELL SGE_QMASTER_PORT=$SGE_QMASTER_PORT SGE_EXECD_PORT=$SGE_EXECD_PORT"; }

cmd_up() {
    local t0=$SECONDS
    need_root up
    have_packages || die "gridengine not installed; run: $0 install"
    mkdir -p "$STATE"
    chmod 755 "$STATE"
    runuser -u sgeadmin -- test -x "$STATE" ||
        die "STATE_DIR $STATE is not reachable by the sgeadmin user (a parent directory mode 0700?); use a directory under /tmp"
    create_cell
    start_qmaster
    configure_cell
    start_execd
    timeout "$TIMEOUT" qsub -b y -sync y -o /dev/null -e /dev/null /bin/true >/dev/null ||
        die "a trivial job (qsub -b y -sync y /bin/true) did not succeed within ${TIMEOUT}s; see $QMASTER_SPOOL/messages"
    env_line >"$STATE/env.sh"
    log "cell up in $((SECONDS - t0)) s"
    env_line
}

cmd_down() {
    if pid_alive "$QMASTER_PID" sge_qmaster; then
        qdel -f -u '*' >/dev/null 2>&1 || true
        wait_for "the deleted jobs to leave the queue" queue_empty ||
            log "jobs still listed after qdel; stopping the daemons anyway"
    fi
    stop_pidfile "$EXECD_PID" sge_execd
    stop_pidfile "$QMASTER_PID" sge_qmaster
}

cmd_status() {
    local ok=0
    pid_alive "$QMASTER_PID" sge_qmaster && echo "sge_qmaster: running" || { echo "sge_qmaster: stopped"; ok=1; }
    pid_alive "$EXECD_PID" sge_execd && echo "sge_execd: running" || { echo "sge_execd: stopped"; ok=1; }
    ((ok == 0)) && { qstat -f -q "$QUEUE" || true; queue_open || ok=1; }
    return "$ok"
}

case ${1:-} in
install) cmd_install ;;
up) set_paths "${2:-}" && cmd_up ;;
down) set_paths "${2:-}" && cmd_down ;;
status) set_paths "${2:-}" && cmd_status ;;
*) usage ;;
esac
