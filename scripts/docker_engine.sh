#!/usr/bin/env bash
# Make sure a Docker engine answers, starting one if we can.
#
# Why: the bash tool runs agent commands in `docker run --network none`
# containers.  The machines this project is built on ship the docker CLI but
# no engine, so as root we install docker.io (and debootstrap, which the
# offline sandbox image build needs) from the Debian archive and start dockerd
# ourselves.  Idempotent: when `docker info` already answers we do nothing.
#
# Storage driver: overlay2 is tried first; if dockerd does not come up with it
# (nested overlayfs is refused in some sandboxes) we restart it with vfs,
# which always works but copies whole layers (slower, more disk).  Force one
# with HARNESS_DOCKER_STORAGE_DRIVER=overlay2|vfs.
#
# Exit codes: 0 engine answers; 1 we tried to start one and failed;
# 2 no engine and we are not root, so the user has to act.
set -u

LOG=${HARNESS_DOCKERD_LOG:-/var/log/harness-dockerd.log}
WAIT_S=${HARNESS_DOCKERD_WAIT_S:-60}

say() { echo "[docker_engine] $*" >&2; }

engine_answers() { docker info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_answers; then
    say "engine already answers ($(docker info --format '{{.ServerVersion}} / {{.Driver}}' 2>/dev/null))"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    cat >&2 <<'EOF'
[docker_engine] No Docker engine answers and this script is not running as root,
so it cannot start one. Do one of:
  - install Docker (https://docs.docker.com/engine/install/) and start it:
        sudo systemctl start docker        # or: sudo dockerd &
  - if the daemon already runs, add your user to the docker group:
        sudo usermod -aG docker "$USER"    # then log in again
  - or run this script as root: sudo scripts/docker_engine.sh
EOF
    exit 2
fi

# --- install what is missing (root) -----------------------------------------
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ! command -v docker >/dev/null 2>&1; then
    [[ " ${missing[*]-} " == *" docker.io "* ]] || missing+=(docker.io)
fi
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    say "installing: ${missing[*]}"
    # Only refresh the package lists when the install cannot find the packages.
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >>"$LOG.apt" 2>&1; then
        say "apt-get install failed with the current lists; running apt-get update"
        apt-get update >>"$LOG.apt" 2>&1 || { say "apt-get update failed (see $LOG.apt)"; exit 1; }
        apt-get install -y --no-install-recommends "${missing[@]}" >>"$LOG.apt" 2>&1 \
            || { say "apt-get install ${missing[*]} failed (see $LOG.apt)"; exit 1; }
    fi
fi

# --- start dockerd ------------------------------------------------------------
start_dockerd() {  # $1 = storage driver; returns 0 once `docker info` answers
    local driver=$1 pid i
    say "starting dockerd --storage-driver $driver (log: $LOG)"
    echo "=== $(date -Is) dockerd --storage-driver $driver ===" >>"$LOG"
    # setsid + nohup: the daemon must outlive the shell (and tool call) that started it.
    setsid nohup dockerd --storage-driver "$driver" >>"$LOG" 2>&1 </dev/null &
    pid=$!
    for ((i = 0; i < WAIT_S; i++)); do
        if engine_answers; then
            say "engine answers after ${i}s (pid $pid, driver $driver)"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            say "dockerd (driver $driver) exited early; last log lines:"
            tail -n 5 "$LOG" >&2
            return 1
        fi
        sleep 1
    done
    say "dockerd (driver $driver) did not answer within ${WAIT_S}s; stopping it"
    kill "$pid" 2>/dev/null
    for ((i = 0; i < 10; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    return 1
}

if pgrep -x dockerd >/dev/null 2>&1; then
    say "a dockerd process exists but does not answer; waiting for it"
    for ((i = 0; i < WAIT_S; i++)); do engine_answers && exit 0; sleep 1; done
    say "the running dockerd (pid $(pgrep -x dockerd | tr '\n' ' ')) never answered; stop it and rerun"
    exit 1
fi

# A stale pid file from a dead daemon makes dockerd refuse to start.
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    rm -f /var/run/docker.pid
fi

if [ -n "${HARNESS_DOCKER_STORAGE_DRIVER:-}" ]; then
    drivers=("$HARNESS_DOCKER_STORAGE_DRIVER")
else
    drivers=(overlay2 vfs)
fi
for d in "${drivers[@]}"; do
    if start_dockerd "$d"; then
        exit 0
    fi
done
say "no Docker engine could be started (tried: ${drivers[*]}); see $LOG"
exit 1
