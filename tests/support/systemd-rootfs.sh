#!/bin/sh
# Builds the Debian root file system that tests/vm_systemd.rs boots, as an
# uncompressed cpio archive (an initramfs: no block-device modules needed).
# Usage: systemd-rootfs.sh OUT.cpio. Needs root and mmdebstrap; the test
# caches the result under ~/.cache/oomguard/ keyed by a hash of this file,
# so any change here rebuilds it. Per-run files (oomguard, the job, the
# scenario and its unit) are appended by the test as a second archive.
set -eu
out="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# systemd with a user manager (user@.service, lingering), the session bus
# the user manager is reached by (dbus-user-session), logind (libpam-systemd).
mmdebstrap --quiet --variant=essential \
  --include=systemd,systemd-sysv,dbus,dbus-user-session,libpam-systemd,util-linux,procps \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --customize-hook='echo "user:x:1000:1000::/home/user:/bin/sh" >> "$1/etc/passwd"' \
  --customize-hook='echo "user:x:1000:" >> "$1/etc/group"' \
  --customize-hook='echo "user:!:19000::::::" >> "$1/etc/shadow"' \
  --customize-hook='mkdir -p "$1/home/user" && chown 1000:1000 "$1/home/user"' \
  --customize-hook='mkdir -p "$1/var/lib/systemd/linger" && touch "$1/var/lib/systemd/linger/user"' \
  --customize-hook='echo oomguard-vm > "$1/etc/hostname"' \
  --customize-hook='rm -f "$1/etc/machine-id" && echo uninitialized > "$1/etc/machine-id"' \
  --customize-hook='for u in getty@tty1.service serial-getty@ttyS0.service systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer systemd-tmpfiles-clean.timer; do ln -sf /dev/null "$1/etc/systemd/system/$u"; done' \
  --customize-hook='rm -rf "$1/var/cache/apt" "$1/var/lib/apt/lists"' \
  bookworm "$work/root" http://deb.debian.org/debian
# The kernel starts /init from an initramfs.
ln -sf /lib/systemd/systemd "$work/root/init"
(cd "$work/root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc) > "$out.tmp"
mv "$out.tmp" "$out"
