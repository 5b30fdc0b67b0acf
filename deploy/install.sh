#!/usr/bin/env bash
# Install pylogd on a server, as root: the `pylog` system user, a virtual environment in
# /opt/pylog/.venv with pylog (from SOURCE: this checkout by default, or a wheel built with
# `pip wheel . --no-deps -w dist`), /etc/pylog/pylogd.toml from deploy/pylogd.toml (kept if it
# exists: edit it there), /var/lib/pylog, the README and docs/ in /opt/pylog (the unit's
# Documentation=), and the systemd unit, installed and enabled; pylog-mirror's unit and
# /etc/pylog/pylog-mirror.toml (kept if it exists) too, and pylog-console's unit, not enabled.
# Start it with `systemctl start pylogd`. Safe to run again: it upgrades pylog and keeps the config.
#
#   deploy/install.sh [SOURCE]
#
# First it installs what is missing of Python 3.11 or newer with venv, and of what the private
# ZooKeeper needs (a headless JRE, libzookeeper-java), with `scripts/setup --system-only` (apt).
# DESTDIR=DIR installs into DIR as the root instead (for packaging and tests): no package, no
# user, nothing is chowned, and the unit is enabled with `systemctl --root`, which needs no
# running systemd; the Python that runs it needs venv.
set -euo pipefail
deploy=$(cd "$(dirname "$0")" && pwd)
checkout=$(dirname "$deploy")
source=${1:-$checkout}
root=${DESTDIR:-}
python=${PYTHON:-python3}

[ -n "$root" ] || "$checkout/scripts/setup" --system-only
if [ -z "$root" ] && ! id -u pylog >/dev/null 2>&1; then
    echo "install: creating the system user pylog"
    useradd --system --home-dir /var/lib/pylog --no-create-home --shell /usr/sbin/nologin pylog
fi

echo "install: pylog from $source into $root/opt/pylog/.venv"
[ -x "$root/opt/pylog/.venv/bin/python" ] || "$python" -m venv "$root/opt/pylog/.venv"
"$root/opt/pylog/.venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade \
    "$source[broker]"
# The unit's Documentation=: the README and docs/ of this checkout.
install -D -m 0644 "$checkout/README.md" "$root/opt/pylog/README.md"
install -D -m 0644 -t "$root/opt/pylog/docs" "$checkout"/docs/*.md

if [ -e "$root/etc/pylog/pylogd.toml" ]; then
    echo "install: keeping $root/etc/pylog/pylogd.toml"
else
    install -D -m 0644 "$deploy/pylogd.toml" "$root/etc/pylog/pylogd.toml"
fi
if [ ! -e "$root/etc/pylog/pylog-mirror.toml" ]; then
    install -D -m 0644 "$deploy/pylog-mirror.toml" "$root/etc/pylog/pylog-mirror.toml"
fi
owner=()
[ -n "$root" ] || owner=(-o pylog -g pylog)
install -d -m 0750 "${owner[@]}" "$root/var/lib/pylog"

install -D -m 0644 "$deploy/systemd/pylogd.service" "$root/etc/systemd/system/pylogd.service"
# The mirror's unit, not enabled (docs/mirror.md): edit /etc/pylog/pylog-mirror.toml first.
install -D -m 0644 "$deploy/systemd/pylog-mirror.service" \
    "$root/etc/systemd/system/pylog-mirror.service"
# The console's unit, not enabled (docs/console.md): read-only on 127.0.0.1:9180.
install -D -m 0644 "$deploy/systemd/pylog-console.service" \
    "$root/etc/systemd/system/pylog-console.service"
if [ -n "$root" ]; then
    systemctl --root="$root" enable pylogd.service
else
    systemctl daemon-reload
    systemctl enable pylogd.service
fi
echo "install: done; edit $root/etc/pylog/pylogd.toml, then: systemctl start pylogd"
