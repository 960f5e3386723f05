#!/usr/bin/env bash
# Runs the README test command (`bash test/run.sh`) inside a minimal root of
# other Debian releases, each with its own PostgreSQL:
#
#   bash test/versions.sh trixie        # Debian 13, PostgreSQL 17 (CI)
#   bash test/versions.sh trixie sid    # ... and unstable, PostgreSQL 18
#
# For each release it makes (once; later runs reuse it) a debootstrap minimal
# root under /var/cache/sharding-roots/RELEASE (SHARDING_ROOTS=DIR to put them
# elsewhere), from the Debian mirror the host's apt already uses; copies a
# clean clone of the current checkout (committed state, HEAD) into it;
# bind-mounts /proc, /sys, /dev, /dev/pts and /dev/shm; runs `bash test/run.sh`
# inside with the release's default PostgreSQL (the run installs the packages
# it needs into the root, which keeps them for the next run); and prints the
# release's closing line as "RELEASE: N passed, N failed". Mounts and the
# clone are removed however it exits. Root only. Exit status: non-zero if any
# release failed or could not be run.
#
# To start a root afresh (e.g. unstable has moved on): rm -rf the directory.
# Extra arguments for the inner run go through the environment:
# SHARDING_ONLY is passed in.
set -uo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)

if [ $# -eq 0 ]; then
    echo "usage: $0 RELEASE... (e.g. trixie sid)" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: debootstrap, mount and chroot need root" >&2
    exit 2
fi

roots=${SHARDING_ROOTS:-/var/cache/sharding-roots}
mkdir -p "$roots"
log() { printf '== %s\n' "$*" >&2; }

# The Debian mirror the host's apt uses for its own release.
host_mirror() {
    local codename uri
    codename=$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-}")
    uri=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' 2>/dev/null |
        awk -v c="$codename" '$2 == c { print $1; exit }')
    echo "${uri:-http://deb.debian.org/debian/}"
}

# make_root RELEASE DIR: a minimal root, made once (DIR/.sharding-root marks
# a finished one; a half-made one is made again).
make_root() {
    local rel=$1 root=$2 mirror
    [ -f "$root/.sharding-root" ] && return 0
    command -v debootstrap >/dev/null || {
        log "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null ||
            { apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null &&
                DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null; } ||
            return 1
    }
    mirror=$(host_mirror)
    log "$rel: debootstrap from $mirror into $root (a few minutes, once)"
    rm -rf "$root.tmp"
    debootstrap --variant=minbase --include=ca-certificates,git,make,gcc,g++,sudo,locales \
        "$rel" "$root.tmp" "$mirror" >"$roots/$rel.debootstrap.log" 2>&1 ||
        { tail -n 20 "$roots/$rel.debootstrap.log" >&2; return 1; }
    echo "deb $mirror $rel main" >"$root.tmp/etc/apt/sources.list"
    # Unstable's Release file is only valid for a week; a mirror that serves
    # a snapshot of the archive (as this machine's may) would be refused.
    echo 'Acquire::Check-Valid-Until "false";' >"$root.tmp/etc/apt/apt.conf.d/99sharding"
    rm -rf "$root" && mv "$root.tmp" "$root" && touch "$root/.sharding-root"
}

# upgrade_from RELEASE: "OLD_RELEASE MAJOR" when the release's root also gets
# that older release's PostgreSQL, for test/tap/640_pg_upgrade.pl. Debian 13
# has only 17; Debian 12's postgresql-15 installs beside it (pinned low, so
# nothing else comes from 12).
upgrade_from() {
    case $1 in
        trixie) echo "bookworm 15" ;;
    esac
}

# add_old_postgres ROOT OLD_RELEASE MAJOR (mounts in place).
add_old_postgres() {
    local root=$1 old=$2 major=$3 mirror
    [ -x "$root/usr/lib/postgresql/$major/bin/pg_ctl" ] &&
        [ -f "$root/usr/include/postgresql/$major/server/postgres.h" ] && return 0
    mirror=$(awk '$1 == "deb" { print $2; exit }' "$root/etc/apt/sources.list")
    echo "deb $mirror $old main" >"$root/etc/apt/sources.list.d/$old.list"
    printf 'Package: *\nPin: release n=%s\nPin-Priority: 100\n' "$old" >"$root/etc/apt/preferences.d/$old"
    log "$(basename "$root"): installing PostgreSQL $major from $old (for pg_upgrade)"
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        sh -c "apt-get update -qq && apt-get install -y -qq postgresql-$major postgresql-server-dev-$major" \
        >"$roots/$(basename "$root").old-postgres.log" 2>&1 ||
        { tail -n 20 "$roots/$(basename "$root").old-postgres.log" >&2; return 1; }
}

mounted=()
work=
undo() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" 2>/dev/null
    done
    mounted=()
    [ -n "$work" ] && rm -rf "$work"
    work=
}
trap undo EXIT
trap 'undo; exit 130' INT TERM HUP

mount_into() {
    local root=$1 d
    for d in proc sys dev dev/pts dev/shm; do
        mkdir -p "$root/$d"
        if [ "$d" = proc ]; then
            mount -t proc proc "$root/proc" || return 1
        else
            mount --bind "/$d" "$root/$d" || return 1
        fi
        mounted+=("$root/$d")
    done
}

status=0
for rel in "$@"; do
    root=$roots/$rel
    start=$(date +%s)
    exec 9>"$roots/$rel.lock"
    flock 9 # one run per root at a time: the root's PostgreSQL is shared
    if ! make_root "$rel" "$root"; then
        echo "$rel: 0 passed, 1 failed (no root)"
        status=1
        continue
    fi
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null
    work=$root/work/sharding-$$
    rm -rf "$work" && mkdir -p "$root/work" &&
        git clone -q "$src" "$work" || {
        echo "$rel: 0 passed, 1 failed (no clone)"
        status=1; undo; continue
    }
    if ! mount_into "$root"; then
        echo "$rel: 0 passed, 1 failed (mounts)"
        status=1; undo; continue
    fi
    from=$(upgrade_from "$rel")
    if [ -n "$from" ]; then
        # On failure the harness reports PostgreSQL ${from#* } missing.
        add_old_postgres "$root" $from || log "$rel: PostgreSQL ${from#* } not installable"
    fi
    log "$rel: bash test/run.sh in $root (commit $(git -C "$work" rev-parse --short HEAD))"
    out=$(mktemp)
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        TERM=dumb CI="${CI:-}" SHARDING_ONLY="${SHARDING_ONLY:-}" SHARDING_UPGRADE_FROM="${from#* }" \
        bash -c "cd /work/sharding-$$ && bash test/run.sh" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    undo
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n 1)
    s=$(grep -E '^[0-9]+ skipped$' "$out" | tail -n 1)
    s=${s%% *}
    rm -f "$out"
    p=0 f=0 s=${s:-0}
    if [[ $line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
        p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]}
    fi
    # A run that failed without saying so, or said nothing, is one failure.
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    [ -z "$line" ] && [ "$f" -eq 0 ] && f=1
    [ "$f" -gt 0 ] && status=1
    log "$rel: $(($(date +%s) - start)) s"
    [ "$s" -gt 0 ] && echo "$rel: $s skipped"
    echo "$rel: $p passed, $f failed"
done
exit $status
