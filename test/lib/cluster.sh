# Shared by test/run.sh, demo/run.sh, test/bench/* and the harnesses:
# install what is missing, build and install the extension, and run a
# throwaway PostgreSQL cluster on a private socket.
#
# PostgreSQL refuses to run as root, so when we are root the server runs as
# the `postgres` OS user; its data and socket directory live in a private
# temporary directory owned by it. Clients (psql, pg_regress, pg_prove) may
# stay root: they only talk to the socket.

# SHARDING_PG=17: the PostgreSQL major version to build and test against.
# Default: the one this Debian release ships (15 on Debian 12, 17 on 13, 18
# on unstable), as postgresql-common reports it once installed.
sharding_default_pg() {
    local v
    if [ -x /usr/share/postgresql-common/supported_versions ]; then
        v=$(/usr/share/postgresql-common/supported_versions 2>/dev/null | sort -n | tail -n 1)
        [ -n "$v" ] && { echo "$v"; return; }
    fi
    # postgresql-common not installed yet: the release's default by name.
    case "$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-}")" in
        bookworm) echo 15 ;;
        trixie) echo 17 ;;
        forky | sid) echo 18 ;;
        *) # Unknown release: the newest server already installed, else 15.
            v=$(ls /usr/lib/postgresql 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -n 1)
            echo "${v:-15}" ;;
    esac
}
PG_MAJOR=${SHARDING_PG:-$(sharding_default_pg)}
export SHARDING_PG=$PG_MAJOR
PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
PG_BIN=/usr/lib/postgresql/$PG_MAJOR/bin
# For developers running several checkouts at once: SHARDING_PGROOT=/some/dir
# makes a private copy of the PostgreSQL tree there, installs the
# extension into it (make install DESTDIR=...) and runs the server from it,
# so that parallel checkouts never overwrite each other's installed files.
if [ -n "${SHARDING_PGROOT:-}" ]; then
    PG_BIN=$SHARDING_PGROOT/usr/lib/postgresql/$PG_MAJOR/bin
fi
export PATH=$PG_BIN:$PATH
SHARDING_PACKAGES="make g++ python3 perl postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR
    libxxhash-dev libicu-dev xxhash postgresql-$PG_MAJOR-pgtap libtap-parser-sourcehandler-pgtap-perl
    postgresql-$PG_MAJOR-plproxy python3-xxhash libipc-run-perl"

log() { printf '== %s\n' "$*" >&2; }

# Installs (as root, with apt-get) whatever the build and tests need.
ensure_packages() {
    local missing=() need
    command -v make >/dev/null || missing+=(make)
    command -v g++ >/dev/null || missing+=(g++)
    command -v python3 >/dev/null || missing+=(python3)
    local v=$PG_MAJOR
    [ -x /usr/lib/postgresql/$v/bin/initdb ] || missing+=(postgresql-$v)
    [ -f /usr/include/postgresql/$v/server/postgres.h ] || missing+=(postgresql-server-dev-$v)
    [ -f /usr/include/xxhash.h ] || missing+=(libxxhash-dev)
    # libpq: the move engine's connections (src/remote/move_remote.cpp).
    [ -f /usr/include/postgresql/libpq-fe.h ] || missing+=(libpq-dev)
    # utils/pg_locale.h includes ICU's headers (Debian builds with ICU).
    [ -f /usr/include/unicode/ucol.h ] || missing+=(libicu-dev)
    command -v xxhsum >/dev/null || missing+=(xxhash)
    [ -f /usr/share/postgresql/$v/extension/pgtap.control ] || missing+=(postgresql-$v-pgtap)
    command -v pg_prove >/dev/null || missing+=(libtap-parser-sourcehandler-pgtap-perl)
    [ -f /usr/share/postgresql/$v/extension/plproxy.control ] || missing+=(postgresql-$v-plproxy)
    # dblink and the other contrib modules ship in postgresql-NN itself.
    [ -f /usr/share/postgresql/$v/extension/dblink.control ] || missing+=(postgresql-$v)
    /usr/bin/python3 -c 'import xxhash' 2>/dev/null || missing+=(python3-xxhash)
    # PostgreSQL::Test::Cluster (the Perl TAP tests, test/tap) needs IPC::Run.
    perl -MIPC::Run -e 1 2>/dev/null || missing+=(libipc-run-perl)
    [ ${#missing[@]} -eq 0 ] && return 0
    # SHARDING_NO_APT (set by make test): report, never install.
    if [ "$(id -u)" -ne 0 ] || [ -n "${SHARDING_NO_APT:-}" ]; then
        log "missing packages: ${missing[*]} (run as root, or: apt-get install ${missing[*]})"
        return 1
    fi
    # Each package once (postgresql-NN may be named twice above).
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | awk '!seen[$0]++')
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Another apt (unattended upgrades on a fresh machine) may hold dpkg's
    # lock for a while: wait for it rather than fail.
    local wait=(-o DPkg::Lock::Timeout=600)
    apt-get "${wait[@]}" update -qq >/dev/null && apt-get "${wait[@]}" install -y -qq "${missing[@]}" >/dev/null ||
        { log "apt-get install failed"; return 1; }
}

# Builds and installs the extension into the system PostgreSQL $PG_MAJOR (or the
# private copy named by SHARDING_PGROOT).
build_and_install() {
    local flags="WERROR=1 ${SHARDING_MAKE_FLAGS:-}" dest=()
    if [ -n "${SHARDING_PGROOT:-}" ]; then
        if [ ! -x "$PG_BIN/postgres" ]; then
            mkdir -p "$SHARDING_PGROOT/usr/lib/postgresql" "$SHARDING_PGROOT/usr/share/postgresql"
            cp -a "/usr/lib/postgresql/$PG_MAJOR" "$SHARDING_PGROOT/usr/lib/postgresql/" &&
                cp -a "/usr/share/postgresql/$PG_MAJOR" "$SHARDING_PGROOT/usr/share/postgresql/" || return 1
        fi
        dest=(DESTDIR="$SHARDING_PGROOT")
    fi
    log "building and installing sharding"
    # `install` rewrites an existing file in place, and a server that has
    # the library mapped then crashes: the installed library is renamed
    # first, so running servers keep the old file and new backends load the
    # new one (the demo harness reinstalls while the test cluster runs).
    local lib
    lib=${SHARDING_PGROOT:-}$($PG_CONFIG --pkglibdir)/sharding.so
    # shellcheck disable=SC2086
    make -s $flags PG_CONFIG=$PG_CONFIG >/dev/null || return 1
    if [ -f "$lib" ]; then mv -f "$lib" "$lib.replaced" || return 1; fi
    # shellcheck disable=SC2086
    if make -s $flags PG_CONFIG=$PG_CONFIG "${dest[@]}" install >/dev/null; then
        rm -f "$lib.replaced"
    else
        [ -f "$lib.replaced" ] && [ ! -f "$lib" ] && mv -f "$lib.replaced" "$lib"
        return 1
    fi
}

# Runs a command as the server's OS user.
# From / : the postgres user may not be able to read the caller's working
# directory (initdb and pg_ctl would print "could not change directory").
# Every path given to it is absolute.
as_server_user() {
    if [ "$(id -u)" -eq 0 ]; then as_server_user_in / "$@"; else "$@"; fi
}

# as_server_user_in DIR command...: the same, from directory DIR (one the
# server user can write to, for tools like pg_upgrade that write there).
as_server_user_in() {
    local dir=$1; shift
    if [ "$(id -u)" -eq 0 ]; then (cd "$dir" && runuser -u postgres -- "$@"); else (cd "$dir" && "$@"); fi
}

# A free TCP port on loopback (for clusters that listen on 127.0.0.1).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_cluster DIR [extra postgres options]: initdb into DIR/data, socket in
# DIR, no TCP unless the options ask for it. Sets PGHOST, PGPORT, PGUSER.
start_cluster() {
    local dir=$1; shift
    mkdir -p "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
    chmod 700 "$dir"
    as_server_user "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 \
        --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
    local port=${SHARDING_PORT:-$(free_port)}
    local opts="-p $port -k $dir -c listen_addresses='' -c fsync=off -c synchronous_commit=off \
        -c full_page_writes=off -c max_connections=120 -c log_min_messages=warning \
        -c shared_preload_libraries=sharding $*"
    if [ -z "${SHARDING_SERVER_ENV:-}${SHARDING_SERVER_WRAPPER:-}" ]; then
        as_server_user "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
            -o "$opts" >/dev/null || { cat "$dir/server.log" >&2; return 1; }
    else
        # SHARDING_SERVER_ENV: extra environment for the server process only
        # (the sanitizer run preloads the ASan runtime this way; pg_ctl itself
        # must not run under it). SHARDING_SERVER_WRAPPER: a command the
        # server runs under (test/memcheck.sh: valgrind).
        # shellcheck disable=SC2086
        as_server_user env ${SHARDING_SERVER_ENV:-} sh -c \
            "exec ${SHARDING_SERVER_WRAPPER:-} '$PG_BIN/postgres' -D '$dir/data' $opts >>'$dir/server.log' 2>&1 </dev/null &"
        local i
        for i in $(seq 300); do
            "$PG_BIN/pg_isready" -q -h "$dir" -p "$port" && break
            sleep 0.5
        done
        "$PG_BIN/pg_isready" -q -h "$dir" -p "$port" || { cat "$dir/server.log" >&2; return 1; }
    fi
    export PGHOST=$dir PGPORT=$port PGUSER=postgres
}

stop_cluster() {
    local dir=$1
    [ -d "$dir/data" ] && as_server_user "$PG_BIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1
    return 0
}

# A private directory the server user can own; removed by the caller.
make_cluster_dir() {
    local base=${TMPDIR:-/tmp}
    mktemp -d "$base/sharding-$1.XXXXXX"
}
