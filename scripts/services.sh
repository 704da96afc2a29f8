#!/usr/bin/env bash
# Start the loopback services the integration tests use, when they are installed and not running.
# Tests that need a service skip with a clear reason when it is absent.
set -u
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if ! up 5432 && command -v pg_ctlcluster >/dev/null 2>&1; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
if ! up 6379 && command -v redis-server >/dev/null 2>&1; then
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
fi
if ! up 3306 && [ -x /usr/sbin/mariadbd ]; then
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
fi
if ! up 5672 && command -v rabbitmq-server >/dev/null 2>&1; then
  rabbitmq-server -detached || true
fi
exit 0
