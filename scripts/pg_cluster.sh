#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests (issue 36): in a temporary directory, on a
# free loopback port, trusting local connections, owned by an unprivileged user (PostgreSQL
# refuses to run as root). Run as root, it creates that user (`lwpg`, or $LW_PG_USER) if
# missing, and says so on stderr; it stays for the next run (`userdel -r lwpg` removes it).
#
#   eval "$(scripts/pg_cluster.sh start)"   # exports LW_TEST_POSTGRES and LW_PG_DIR
#   cargo test
#   scripts/pg_cluster.sh stop             # uses LW_PG_DIR
#
# `start` prints the exports on stdout (everything else goes to stderr). The binaries are
# found on PATH or in Debian's /usr/lib/postgresql/*/bin.
set -euo pipefail

pg_bin() {
  local name=$1
  if command -v "$name" >/dev/null 2>&1; then
    command -v "$name"
    return
  fi
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin/"$name" 2>/dev/null | sort -V | tail -n 1 || true)
  [[ -n "$found" ]] || { echo "pg_cluster: $name not found (apt-get install postgresql)" >&2; exit 1; }
  echo "$found"
}

# Runs a command as the cluster's user (as ourselves when we are not root).
as_owner() {
  if [[ $(id -u) == 0 ]]; then
    local user=${LW_PG_USER:-lwpg}
    if ! id "$user" >/dev/null 2>&1; then
      echo "pg_cluster: creating the system user $user to own the cluster (PostgreSQL refuses to run as root; LW_PG_USER names another; \`userdel -r $user\` removes it)" >&2
      useradd --create-home --shell /bin/bash "$user" >&2
    fi
    su "$user" -c "$(printf '%q ' "$@")"
  else
    "$@"
  fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  local initdb pg_ctl dir port
  initdb=$(pg_bin initdb)
  pg_ctl=$(pg_bin pg_ctl)
  dir=$(mktemp -d /tmp/lw-pg.XXXXXX)
  chmod 755 "$dir"
  if [[ $(id -u) == 0 ]]; then
    as_owner true
    chown "${LW_PG_USER:-lwpg}" "$dir"
  fi
  port=$(free_port)
  as_owner "$initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 >&2
  # Loopback only, its socket in its own directory; in the config file so that a restart
  # (start-server) keeps them. fsync off: a test cluster never outlives its run.
  as_owner sh -c "cat >> '$dir/data/postgresql.conf'" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
fsync = off
max_connections = 200
CONF
  as_owner "$pg_ctl" -D "$dir/data" -l "$dir/log" -w start >&2
  echo "export LW_TEST_POSTGRES=postgres://postgres@127.0.0.1:$port/postgres"
  echo "export LW_PG_DIR=$dir"
}

stop() {
  local dir=${1:-${LW_PG_DIR:-}}
  [[ -n "$dir" && -d "$dir/data" ]] || { echo "pg_cluster: no cluster (LW_PG_DIR)" >&2; return 0; }
  as_owner "$(pg_bin pg_ctl)" -D "$dir/data" -m immediate stop >&2 || true
  rm -rf "$dir"
}

# `pg_ctl` on a running cluster, for tests that stop and restart the server: `restart-server
# DIR` and `stop-server DIR` keep the data.
case "${1:-}" in
  start) start ;;
  stop) stop "${2:-}" ;;
  stop-server) as_owner "$(pg_bin pg_ctl)" -D "$2/data" -m fast -w stop >&2 ;;
  start-server) as_owner "$(pg_bin pg_ctl)" -D "$2/data" -l "$2/log" -w start >&2 ;;
  *) echo "usage: $0 start | stop [DIR] | stop-server DIR | start-server DIR" >&2; exit 2 ;;
esac
