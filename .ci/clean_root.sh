#!/usr/bin/env bash
# Runs a command in a fresh clone of this repository's committed HEAD, inside a clean Debian root
# made from Debian's packages alone: what a new machine has before anything is installed by hand.
#
#   .ci/clean_root.sh make test          # what .ci/run does
#   LMS_CI_KEEP=1 .ci/clean_root.sh ...  # keep the root afterwards (its path is printed)
#
# The root holds only the packages in BASE_PACKAGES (the README's "fresh machine" list). From the
# host it gets, read-only or as copies: the pip and apt settings and the local package folders they
# name (the only way the registries are reached here), DNS and the CA bundle. Nothing else: no
# ~/.cache, no /usr/local, no pip installs, no PATH of the host.
#
# The bare root is made once with debootstrap and cached as a tarball in $LMS_CI_CACHE (default
# ~/.cache/lms-ci); every run unpacks a new copy, so no run sees what another one installed.
# Needs root (debootstrap, chroot, mount). Exit status: that of the command, or 2 for set-up errors.
set -euo pipefail

SUITE=${LMS_CI_SUITE:-trixie}  # Debian 13 (Python 3.13); Debian 12 is the fresh-machine check's
BASE_PACKAGES="python3,python3-venv,python3-pip,make,gcc,g++,git,ca-certificates"
KEYRING=${LMS_CI_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
# The only pip settings passed in from the host's environment: where the packages are and how to reach
# them. Never a token: a value with credentials in a URL (scheme://user:secret@host) is left out, and
# so are caches and everything else (PIP_CACHE_DIR, PIP_CLIENT_CERT, PIP_KEYRING_PROVIDER, ...).
PIP_SETTINGS="PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_NO_INDEX PIP_CERT PIP_TRUSTED_HOST
              PIP_DEFAULT_TIMEOUT PIP_DISABLE_PIP_VERSION_CHECK PIP_CONSTRAINT"
has_credentials() { printf '%s' "$1" | grep -Eq '://[^/@[:space:]]*@'; }
top=$(cd "$(dirname "$0")/.." && pwd)
cache=${LMS_CI_CACHE:-$HOME/.cache/lms-ci}
say() { echo "[clean-root] $*"; }

[ $# -gt 0 ] || { echo "usage: $0 COMMAND..."; exit 2; }
if [ "$(id -u)" != 0 ]; then
  say "needs root: it builds a Debian root with debootstrap, mounts /proc, /sys, /dev into it and chroots."
  say "Run it as root (e.g. sudo), or run the command in this checkout as it is, which is NOT a fresh"
  say "machine (whatever is installed here is used): LMS_CI_IN_PLACE=1 bash .ci/run"
  exit 2
fi

# The Debian mirror the host's apt uses (its registry), else Debian's own.
mirror=${LMS_CI_MIRROR:-$(
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources || true;
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list || true; } \
  | awk '$1 == "URIs:" {print $2} $1 == "deb" {print ($2 ~ /^\[/ ? $3 : $2)}' | grep -v security | head -1 || true)}
mirror=${mirror:-http://deb.debian.org/debian}

# 1. The cached bare root (remade when the package list, suite or mirror changes).
key=$(echo "$SUITE $BASE_PACKAGES $mirror" | sha256sum | cut -c1-12)
tarball="$cache/rootfs-$SUITE-$key.tar"
mkdir -p "$cache"
# A cached root is used only as it was made: its sha256, recorded when it was made, must match;
# otherwise (damaged, or cached before sha256s were kept) it is made anew.
if [ -f "$tarball" ] && ! (cd "$cache" && sha256sum --quiet -c "$(basename "$tarball").sha256" >/dev/null 2>&1); then
  say "the cached root $tarball does not match its recorded sha256 (or has none): making it anew"
  rm -f "$tarball" "$tarball.sha256"
fi
if [ ! -f "$tarball" ]; then
  command -v debootstrap >/dev/null || { say "apt-get install debootstrap"; apt-get install -y -q debootstrap >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q debootstrap >/dev/null; }; }
  # Debian's archive keyring checks the Release files debootstrap fetches (and through them every package)
  [ -f "$KEYRING" ] || { say "apt-get install debian-archive-keyring"; apt-get install -y -q debian-archive-keyring >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q debian-archive-keyring >/dev/null; }; }
  [ -f "$KEYRING" ] || { say "no Debian archive keyring at $KEYRING: cannot check what debootstrap fetches"; exit 2; }
  build=$(mktemp -d "$cache/debootstrap.XXXXXX")
  say "debootstrap $SUITE from $mirror, checked with $KEYRING (once; cached as $tarball)"
  t0=$(date +%s)
  if ! debootstrap --keyring="$KEYRING" --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$build" "$mirror" \
       >"$cache/debootstrap.log" 2>&1; then
    say "debootstrap failed: see $cache/debootstrap.log"; rm -rf --one-file-system "$build"; exit 2
  fi
  # the tarball and its sha256 take their names only when both were written whole
  if tar -C "$build" -cf "$tarball.part" . && (cd "$cache" && sha256sum "$(basename "$tarball.part")" \
       | sed 's/\.part$//' >"$tarball.sha256.part") && mv "$tarball.part" "$tarball" \
       && mv "$tarball.sha256.part" "$tarball.sha256"; then
    rm -rf --one-file-system "$build"
    say "root cached in $(( $(date +%s) - t0 )) s"
  else
    rm -rf --one-file-system "$build"; rm -f "$tarball" "$tarball.part" "$tarball.sha256" "$tarball.sha256.part"
    say "could not write the cached root $tarball (disk full?)"; exit 2
  fi
fi

# 2. A fresh copy, with its mounts undone on any exit (Ctrl-C included) and deleted only when no
#    mount is left inside it.
work=$(mktemp -d /tmp/lms-ci.XXXXXX)
root="$work/root"
mounted=()
# (awk reads all of findmnt's output: with grep -q and pipefail, an early exit would read as "none")
mounts_left() { findmnt -rn -o TARGET | awk -v r="$root/" 'index($0, r) == 1 {n++} END {exit n == 0}'; }
cleanup() {
  local i
  for (( i=${#mounted[@]}-1; i>=0; i-- )); do umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" 2>/dev/null || true; done
  if mounts_left; then
    say "mounts remain under $root; not deleting $work"
  elif [ -n "${LMS_CI_KEEP:-}" ]; then
    say "kept $root"
  else
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$root"
tar -C "$root" -xf "$tarball"
bind() {  # bind <host path> [ro]
  mkdir -p "$root$1"
  mount --bind "$1" "$root$1"
  mounted+=("$root$1")
  if [ "${2:-}" = ro ]; then mount -o remount,bind,ro "$root$1"; fi
}
for m in proc sys dev dev/pts; do bind "/$m"; done

# 3. The host's ways to its registries. apt: its settings files (not its sources: the root keeps
#    Debian's own list from debootstrap). pip: its settings files, the folders and files they name
#    (read-only), and the PIP_* variables named in PIP_SETTINGS (no tokens, no caches).
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
for f in /etc/apt/apt.conf.d/99*; do [ -f "$f" ] && cp "$f" "$root/etc/apt/apt.conf.d/"; done
for f in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
  [ -f "$f" ] || continue
  dest="$root${f/#$HOME//root}"; mkdir -p "$(dirname "$dest")"
  # copied without lines that hold credentials in a URL
  grep -Ev '://[^/@[:space:]]*@' "$f" >"$dest" || true
  if grep -Eq '://[^/@[:space:]]*@' "$f"; then say "note: lines with credentials in $f are not passed in"; fi
done
pipcmd=$(command -v pip || command -v pip3 || echo "python3 -m pip")
pipenv=()
for name in $PIP_SETTINGS; do
  [ -n "${!name+x}" ] || continue
  if has_credentials "${!name}"; then say "note: $name holds credentials: not passed in"; continue; fi
  pipenv+=("$name=${!name}")
done
values=$( { $pipcmd config list 2>/dev/null | grep -Ev '://[^/@[:space:]]*@' || true; printf '%s\n' "${pipenv[@]}"; } \
  | sed -E "s/^[^=]*=//; s/'//g" | tr ' ' '\n')
for v in $values; do
  p=${v#file://}
  case "$p" in /*) ;; *) continue ;; esac
  [ -d "$p" ] && case "$p" in */simple|*/simple/) p=$(dirname "${p%/}") ;; esac
  if [ -d "$p" ]; then
    findmnt -rn -o TARGET | grep -x "$root$p" >/dev/null || bind "$p" ro
  elif [ -f "$p" ]; then
    mkdir -p "$root$(dirname "$p")"; cp "$p" "$root$p"
  fi
done

# 4. A fresh clone of the committed HEAD, and the command.
if [ -n "$(git -C "$top" status --porcelain --untracked-files=no)" ]; then
  say "note: $top has uncommitted changes; they are not part of this run (it clones HEAD)"
fi
git clone -q "$top" "$root/project"
say "HEAD $(git -C "$root/project" rev-parse --short HEAD) in a clean $SUITE root ($work); running: $*"
t0=$(date +%s)
set +e
chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 CI="${CI:-true}" \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${pipenv[@]}" \
  /bin/bash -c 'cd /project && exec "$@"' bash "$@"
rc=$?
set -e
say "$* exited $rc after $(( $(date +%s) - t0 )) s"
exit $rc
