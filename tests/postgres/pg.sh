#!/usr/bin/env bash
# Bring up a real, throw-away PostgreSQL server on 127.0.0.1 for tests and benchmarks.
#
#   pg.sh install            apt-get Debian's postgresql if its binaries are missing (root)
#   pg.sh up STATE_DIR       initdb (first time), start on 127.0.0.1:PORT + a unix socket in STATE_DIR,
#                            create role and database `abtune` with a random password
#   pg.sh down STATE_DIR     pg_ctl stop -m fast (by the data dir's postmaster.pid), wait for the exit
#   pg.sh status STATE_DIR   exit 0 only if the server accepts connections
#
# Everything (data dir, socket, log, port and password files) lives in STATE_DIR; nothing goes into
# /etc or /var/lib/postgresql, and Debian's own "main" cluster is left alone.
# As root the server runs as the `postgres` user (postgres refuses to run as root); as anyone else
# it runs as that user. STATE_DIR/port holds the TCP port, STATE_DIR/password (mode 600) the password
# of role `abtune`; `up` prints the URL with the password masked.
# Environment: ABTUNE_PG_PORT (default: a free port picked at the first `up`, then kept),
#              ABTUNE_PG_BIN (default: the newest /usr/lib/postgresql/*/bin),
#              ABTUNE_PG_TIMEOUT (seconds for each bounded wait, default 60).
set -euo pipefail

ROLE=abtune
DATABASE=abtune
TIMEOUT=${ABTUNE_PG_TIMEOUT:-60}
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

# log, die, usage, wait_for
. "$(dirname "${BASH_SOURCE[0]}")/../script_helpers.sh"

# ---------------------------------------------------------------- helpers
pg_bin() {
    if [[ -n ${ABTUNE_PG_BIN:-} ]]; then
        echo "$ABTUNE_PG_BIN"
        return
    fi
    local dirs
    dirs=$(compgen -G '/usr/lib/postgresql/*/bin/postgres' | sort -V | tail -n1) || true
    [[ -n $dirs ]] && dirname "$dirs"
}

have_packages() {
    local bin c
    bin=$(pg_bin)
    [[ -n $bin ]] || return 1
    for c in initdb pg_ctl postgres psql pg_isready; do [[ -x $bin/$c ]] || return 1; done
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port: a random port that nothing on 127.0.0.1 answers on, from 20000 up to the kernel's ephemeral range
# (ip_local_port_range, 32768-60999 by default), never inside it: there the port of any client connection (a rank's
# rendezvous, an HTTP request) could take it between this check and postgres's bind, "Address already in use".
free_port() {
    local i p low=32768
    [[ -r /proc/sys/net/ipv4/ip_local_port_range ]] && read -r low _ </proc/sys/net/ipv4/ip_local_port_range
    ((low > 21024)) || low=32768
    for ((i = 0; i < 100; i++)); do
        p=$((20000 + RANDOM % (low - 20000)))
        port_in_use "$p" || {
            echo "$p"
            return 0
        }
    done
    die "no free port found on 127.0.0.1"
}

# as_owner CMD...: run CMD as the server's OS user (postgres when we are root, else ourselves).
as_owner() {
    if [[ $(id -u) == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

set_paths() {
    [[ -n ${1:-} ]] || usage
    STATE=$(realpath -m -- "$1")
    DATA=$STATE/data
    SOCKET_DIR=$STATE/run
    LOGFILE=$STATE/postgresql.log
    PORT_FILE=$STATE/port
    PASSWORD_FILE=$STATE/password
    BIN=$(pg_bin)
    # unix socket paths are limited to 107 bytes: SOCKET_DIR/.s.PGSQL.PORT
    ((${#SOCKET_DIR} <= 90)) || die "STATE_DIR path too long for a unix socket (max ~85 chars): $STATE"
}

# server_pid: the postmaster's pid from DATA/postmaster.pid if that process is alive and is postgres.
server_pid() {
    local pid
    [[ -s $DATA/postmaster.pid ]] || return 1
    pid=$(head -n1 "$DATA/postmaster.pid" | tr -dc '0-9')
    [[ -n $pid && -r /proc/$pid/comm ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == postgres* ]] || return 1
    [[ $(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) != Z ]] || return 1
    echo "$pid"
}

accepting() { "$BIN/pg_isready" -q -U postgres -h "$SOCKET_DIR" -p "$(cat "$PORT_FILE")" -t 2; }

# psql_admin: psql as superuser `postgres` over the unix socket (trust), SQL on stdin.
psql_admin() {
    as_owner "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCKET_DIR" -p "$(cat "$PORT_FILE")" \
        -U postgres -d postgres "$@"
}

masked_url() { echo "postgresql+psycopg2://$ROLE:***@127.0.0.1:$(cat "$PORT_FILE")/$DATABASE"; }

# ---------------------------------------------------------------- install
cmd_install() {
    if have_packages; then
        log "postgresql already installed ($(pg_bin))"
        return 0
    fi
    [[ $(id -u) == 0 ]] || die "'install' must run as root (apt-get)"
    log "installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null || die "apt-get install postgresql failed"
    have_packages || die "postgresql installed but no /usr/lib/postgresql/*/bin with initdb, pg_ctl, postgres, psql"
}

# ---------------------------------------------------------------- up
prepare() {
    mkdir -p "$STATE"
    if [[ $(id -u) == 0 ]]; then
        id -u postgres >/dev/null 2>&1 || die "no 'postgres' user to run the server as; run: $0 install"
        chmod 755 "$STATE"
        runuser -u postgres -- test -x "$STATE" ||
            die "STATE_DIR $STATE is not reachable by the postgres user (a parent directory mode 0700?); use a directory under /tmp"
        install -d -m 700 -o postgres -g postgres "$DATA" "$SOCKET_DIR"
        [[ -e $LOGFILE ]] || install -m 600 -o postgres -g postgres /dev/null "$LOGFILE"
    else
        install -d -m 700 "$DATA" "$SOCKET_DIR"
        [[ -e $LOGFILE ]] || install -m 600 /dev/null "$LOGFILE"
    fi
    [[ -s $PORT_FILE ]] || echo "${ABTUNE_PG_PORT:-$(free_port)}" >"$PORT_FILE"
    if [[ ! -s $PASSWORD_FILE ]]; then
        (umask 077 && head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$PASSWORD_FILE")
    fi
    chmod 600 "$PASSWORD_FILE"
}

init_cluster() {
    [[ -s $DATA/PG_VERSION ]] && return 0
    log "initdb $DATA"
    # local (unix socket, mode 0700 dir) = trust for the superuser; TCP = password (scram) only.
    as_owner "$BIN/initdb" -D "$DATA" -U postgres -E UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >"$STATE/initdb.log" 2>&1 ||
        die "initdb failed; see $STATE/initdb.log"
    # postgresql.auto.conf overrides postgresql.conf; written once, kept for later `up`s.
    cat >>"$DATA/postgresql.auto.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $(cat "$PORT_FILE")
unix_socket_directories = '$SOCKET_DIR'
unix_socket_permissions = 0700
max_connections = 60
shared_buffers = 32MB
log_min_error_statement = panic
EOF
}

create_role_and_database() {
    local pass
    pass=$(cat "$PASSWORD_FILE")
    # The password travels on stdin (not argv); `log_min_error_statement = panic` keeps a failing
    # statement, and so the password, out of the server log.
    psql_admin -f - >/dev/null <<EOF || die "could not create role/database $ROLE; see $LOGFILE"
SELECT 'CREATE ROLE $ROLE' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') \gexec
ALTER ROLE $ROLE LOGIN CREATEDB PASSWORD '$pass';
SELECT 'CREATE DATABASE $DATABASE OWNER $ROLE' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DATABASE') \gexec
EOF
}

cmd_up() {
    local t0=$SECONDS port
    have_packages || die "postgresql binaries not found under /usr/lib/postgresql/*/bin; run: $0 install"
    prepare
    init_cluster
    port=$(cat "$PORT_FILE")
    if server_pid >/dev/null; then
        log "postgres already running (pid $(server_pid))"
    else
        port_in_use "$port" && die "port $port is already in use by another process; set ABTUNE_PG_PORT or use a new STATE_DIR"
        log "starting postgres on 127.0.0.1:$port"
        # pg_ctl starts the postmaster in the background (stdio to LOGFILE) and -w waits until it accepts connections.
        as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOGFILE" -w -t "$TIMEOUT" start >>"$STATE/pg_ctl.log" 2>&1 ||
            die "postgres did not start; see $LOGFILE"
    fi
    accepting || die "postgres is not accepting connections; see $LOGFILE"
    create_role_and_database
    log "postgres up in $((SECONDS - t0))s (state: $STATE)"
    masked_url
}

# ---------------------------------------------------------------- down / status
cmd_down() {
    local pid i
    [[ -d $STATE ]] || {
        log "no state dir $STATE; nothing to stop"
        return 0
    }
    pid=$(server_pid) || {
        log "postgres not running"
        return 0
    }
    log "stopping postgres (pid $pid)"
    as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w -t "$TIMEOUT" stop >>"$STATE/pg_ctl.log" 2>&1 ||
        log "pg_ctl stop failed; see $STATE/pg_ctl.log"
    if server_pid >/dev/null; then
        log "postgres (pid $pid) still running after ${TIMEOUT}s; sending SIGQUIT (immediate shutdown)"
        kill -QUIT "$pid" 2>/dev/null || true
        for ((i = 0; i < 5 * TIMEOUT; i++)); do
            server_pid >/dev/null || break
            sleep 0.2
        done
        server_pid >/dev/null && die "postgres (pid $pid) survived SIGQUIT"
    fi
    log "postgres down (state kept in $STATE)"
}

cmd_status() {
    local pid
    if pid=$(server_pid) && accepting; then
        echo "postgres     running (pid $pid), accepting connections"
        masked_url
        return 0
    fi
    echo "postgres     stopped"
    return 1
}

case "${1:-}" in
install) cmd_install ;;
up) set_paths "${2:-}" && cmd_up ;;
down) set_paths "${2:-}" && cmd_down ;;
status) set_paths "${2:-}" && cmd_status ;;
*) usage ;;
esac
