# Shared setup for scripts/test, scripts/demo and .ci/run: source it, do not run it.
#
# Provides:
#   LOCKS_ROOT             absolute path of the repository
#   locks_log MSG...       print a "==> MSG" line on stderr
#   locks_die MSG...       print an error line on stderr and exit 1
#   locks_apt_install PKG  install Debian packages that are missing (non-interactive;
#                          runs apt-get update only when the first attempt fails)
#   locks_setup_venv       create .venv if needed and install requirements-dev.txt into it
#                          (skipped when the stamp shows the requirements files unchanged);
#                          then activates it
#
# Environment:
#   PYTHON        interpreter used to create .venv (default: python3; must be 3.11+)
#   LOCKS_VENV    the virtualenv's directory under the repository (default: .venv)
#   LOCKS_DJANGO  a Django requirement installed over requirements-dev.txt's, e.g.
#                 "Django>=6,<7" to run the tests on a newer Django (default: none)

# shellcheck shell=bash

LOCKS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export LOCKS_ROOT

locks_log() {
    printf '==> %s\n' "$*" >&2
}

locks_die() {
    printf 'ERROR: %s\n' "$*" >&2
    exit 1
}

# Install the given Debian packages if any of them is not installed yet.
locks_apt_install() {
    local missing=() pkg
    for pkg in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        locks_die "missing Debian packages (${missing[*]}) and no apt-get to install them"
    fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        sudo=(sudo)
    fi
    locks_log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    local apt_opts=(-y -q --no-install-recommends -o Dpkg::Use-Pty=0)
    if ! "${sudo[@]}" apt-get install "${apt_opts[@]}" "${missing[@]}" </dev/null; then
        locks_log "apt-get install failed; running apt-get update and retrying"
        "${sudo[@]}" apt-get update -q </dev/null \
            || locks_die "apt-get update failed"
        "${sudo[@]}" apt-get install "${apt_opts[@]}" "${missing[@]}" </dev/null \
            || locks_die "could not install Debian packages: ${missing[*]}"
    fi
}

# Hash of everything that decides what is installed in the virtualenv $1.
_locks_requirements_hash() {
    {
        "$1/bin/python" -c 'import sys; print(sys.version)'
        cat "$LOCKS_ROOT/requirements.txt" "$LOCKS_ROOT/requirements-dev.txt"
        printf '%s\n' "${LOCKS_DJANGO:-}"
    } | sha256sum | cut -d' ' -f1
}

locks_setup_venv() {
    local python="${PYTHON:-python3}"
    local name="${LOCKS_VENV:-.venv}"
    local venv="$LOCKS_ROOT/$name"
    local stamp="$venv/.requirements.sha256"

    if [ -e "$venv" ] && ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
        locks_log "virtualenv $name is broken (its interpreter does not run): recreating it"
        rm -rf "$venv"
    fi
    if [ ! -x "$venv/bin/python" ]; then
        command -v "$python" >/dev/null 2>&1 || locks_die "$python not found (set PYTHON=...)"
        "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
            || locks_die "$python is $("$python" -V 2>&1); Python 3.11+ is required"
        locks_log "creating virtualenv $name with $("$python" -V 2>&1)"
        "$python" -m venv "$venv" || locks_die "python -m venv failed"
    fi

    local want
    want="$(_locks_requirements_hash "$venv")"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        locks_log "virtualenv $name is up to date"
    else
        # mysqlclient has no Linux wheel: it is compiled against libmariadb.
        locks_apt_install gcc pkg-config libmariadb-dev
        locks_log "installing requirements-dev.txt into $name"
        local start=$SECONDS
        # Never let playwright fetch browsers of its own: tests use Debian's chromium.
        # The full pip output goes to a log file, shown only when pip fails.
        local log="$venv/pip-install.log"
        if ! PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
            "$venv/bin/python" -m pip install -r "$LOCKS_ROOT/requirements-dev.txt" \
            </dev/null >"$log" 2>&1; then
            tail -n 60 "$log" >&2
            locks_die "pip install -r requirements-dev.txt failed (full log: $log)"
        fi
        if [ -n "${LOCKS_DJANGO:-}" ]; then
            # Over requirements.txt's pin, which keeps the usual venv on the LTS.
            locks_log "installing $LOCKS_DJANGO into $name"
            "$venv/bin/python" -m pip install "$LOCKS_DJANGO" </dev/null >>"$log" 2>&1 \
                || { tail -n 30 "$log" >&2; locks_die "pip install $LOCKS_DJANGO failed (log: $log)"; }
        fi
        printf '%s\n' "$want" >"$stamp"
        locks_log "requirements installed in $((SECONDS - start)) s"
    fi

    # Activate: put the venv first on PATH for python, pytest, ruff, mypy.
    export VIRTUAL_ENV="$venv"
    export PATH="$venv/bin:$PATH"
    unset PYTHONHOME
}
