# shellcheck shell=bash
# Sourced by the scripts that install Debian packages they need (scripts/setup.sh,
# scripts/build-pgo.sh, .ci/run): one way to do it, with sudo when not root.

# apt_install PACKAGE...: installs the packages named (nothing when none are), without letting
# their post-install scripts start services (memcached would grab port 11211).
apt_install() {
  [ $# -gt 0 ] || return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
  fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@"
}
