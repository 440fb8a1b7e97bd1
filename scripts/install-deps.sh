#!/bin/sh
# Installs the Debian packages cinfer builds and tests with. Idempotent: packages
# already present are skipped, so a second run does no network work.
set -e
PKGS="build-essential pkg-config libopenblas-dev libpcre2-dev libutf8proc-dev \
libjansson-dev libmicrohttpd-dev libxxhash-dev python3 python3-numpy"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
echo "cinfer dependencies present"
