// The guest's launch step (microvm_guest_scripts.h). Every external command in the guest is a
// fork and exec, which costs ~30 ms under TCG: the scripts use shell builtins where they can.
#include "compass-runner/microvm_guest_scripts.h"

namespace runner::microvm {
namespace {

// What both stages use, sourced by each (a builtin: no fork). $B is each stage's busybox.
// die: says why on the console and, once the control port is fd 3, to the runner ("fail …"),
// then powers the guest off. port: sets P to /dev/vportNpM of the port named $1.
constexpr std::string_view kGuestLib = R"SH(# compass-runner microvm guest: shared by both stages.
log() { read -r up _ < /proc/uptime; echo "compass-init: [$up] $*" > /dev/console; }
die() {
  echo "compass-init: FATAL: $*" > /dev/console
  [ -e /proc/self/fd/3 ] && echo "fail $*" >&3
  $B poweroff -f; $B reboot -f
}
port() {
  for p in /sys/class/virtio-ports/*; do
    n=; read -r n < "$p/name" 2>/dev/null
    [ "$n" = "$1" ] && { P="/dev/${p##*/}"; return 0; }
  done
  return 1
}
# The host's nft, with its own libraries and loader ($D: /compass, or /.compass in the root).
nft() { "$D/nft/ld.so" --library-path "$D/nft" "$D/nft/nft" "$@"; }
)SH";

// Stage 1: PID 1 in the initramfs. Every failure says why on the console and on the control
// port ("fail …", which the runner shows), then powers the guest off.
constexpr std::string_view kStage1 = R"SH(#!/bin/busybox sh
# compass-runner microvm guest, stage 1 (PID 1 in the initramfs). Every external command is a
# fork and exec, which costs ~30 ms under TCG: the mounts go in fstab files, the modules in one
# modprobe, and the port lookups use shell builtins only.
B=/bin/busybox D=/compass
. /compass/lib.sh
$B mount -a -T /etc/fstab.early
log "stage 1: loading modules"
read -r modules < /lib/modules/order
$B modprobe -a $modules || die "modprobe $modules"
i=0
until port compass.control && [ -c "$P" ] && [ -b /dev/vda ]; do
  i=$((i + 1)); [ $i -gt 2000 ] && die "no control port or /dev/vda after 20 s"
  $B usleep 10000
done
exec 3<>"$P" || die "open $P"
echo boot >&3
if [ -e /compass/firewall.nft ]; then
  # Egress firewall: default drop before eth0 comes up, checked as the kernel holds it.
  log "stage 1: arming egress"
  . /compass/firewall.env || die "read firewall.env"
  nft -f /compass/firewall.nft || die "nft -f: the egress ruleset did not load"
  # The chains' declarations only (no sets, rules, elements: far less to dump and print under
  # emulation); the ruleset began with `flush ruleset`, so ours must be the kernel's only table.
  t=$(nft list chains) || die "nft list chains failed"
  case $t in "table inet compass_egress {"*) ;; *) die "nft list: no table inet compass_egress" ;; esac
  case ${t#table} in *"table "*) die "nft list: a table besides inet compass_egress" ;; esac
  case $t in *"hook output priority filter; policy drop;"*) ;; *) die "output chain not drop" ;; esac
  case $t in *"hook input priority filter; policy drop;"*) ;; *) die "input chain not drop" ;; esac
  i=0
  until [ -e /sys/class/net/eth0 ]; do
    i=$((i + 1)); [ $i -gt 2000 ] && die "no eth0 after 20 s"
    $B usleep 10000
  done
  echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad && echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_ra ||
    die "eth0 IPv6 settings"
  $B ip link set lo up && $B ip addr add "$FW_ADDR4" dev eth0 && $B ip addr add "$FW_ADDR6" dev eth0 &&
    $B ip link set eth0 up && $B ip route add default via "$FW_GW4" &&
    $B ip -6 route add default via "$FW_GW6" || die "configure eth0"
  echo armed >&3
fi
# Every module the guest needs is loaded: none can be loaded from here on, by anyone (an agent
# that reached root in the guest included). Nothing later asks for one: nft's set updates in
# stage 2 use what `nft -f` above set up (and no autoload could have worked so far: the
# initramfs has no modprobe; the default image has neither modprobe nor this kernel's modules).
echo 1 > /proc/sys/kernel/modules_disabled || die "kernel.modules_disabled=1"
log "stage 1: mounting the root"
$B mkdir /rw/upper /rw/work /dev/pts /dev/shm || die "mkdir in the scratch tmpfs and /dev"
$B mount -a -T /etc/fstab.root || die "mount the root (erofs on /dev/vda, tmpfs overlay)"
$B mkdir -p -m 0700 /newroot/.compass /newroot/dev /newroot/proc /newroot/sys ||
  die "make the mount points in the root"
$B mount -a -T /etc/fstab.new || die "mount /dev, /proc, /sys and the launch step in the root"
cd /newroot || die "cd /newroot"
# switch_root without emptying the initramfs (/.compass is a bind of its /compass, and stays
# out of the agent's reach: 0700 root).
$B mount --move . / || die "move the root to /"
exec $B chroot . /.compass/busybox sh /.compass/stage2
)SH";

// Mount tables for stage 1's `mount -a -T` (one process per table, not per mount).
constexpr std::string_view kFstabEarly =
    "proc /proc proc nosuid,nodev,noexec 0 0\n"
    "sysfs /sys sysfs nosuid,nodev,noexec 0 0\n"
    "devtmpfs /dev devtmpfs nosuid 0 0\n"
    "scratch /rw tmpfs mode=0755 0 0\n";
constexpr std::string_view kFstabRoot =
    "/dev/vda /lower erofs ro,nodev 0 0\n"
    "root /newroot overlay nodev,lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work 0 0\n";
// New proc and sysfs instances in the root (busybox's `mount -a` does not do MS_MOVE), the one
// devtmpfs again, and the launch step bound at /.compass.
constexpr std::string_view kFstabNew =
    "proc /newroot/proc proc nosuid,nodev,noexec 0 0\n"
    "sysfs /newroot/sys sysfs nosuid,nodev,noexec 0 0\n"
    "devtmpfs /newroot/dev devtmpfs nosuid 0 0\n"
    "devpts /newroot/dev/pts devpts newinstance,ptmxmode=0666,mode=0620,nosuid,noexec 0 0\n"
    "shm /newroot/dev/shm tmpfs mode=1777,nosuid,nodev 0 0\n"
    "/compass /newroot/.compass none bind 0 0\n";

// Stage 2: PID 1 in the agent's root (fd 3 = the control port, kept across the chroot). The
// control loop runs in the background from the start: it stops the agent ("stop", before or
// after it started) and applies the forwarder's set elements ("allow SEQ BATCH").
constexpr std::string_view kStage2 =
    R"SH(# compass-runner microvm guest, stage 2 (PID 1 in the agent's root).
B=/.compass/busybox D=/.compass
. /.compass/lib.sh
. /.compass/agent.env || die "read agent.env"
port compass.stdout && OUT=$P || die "no stdout port"
port compass.stderr && ERR=$P || die "no stderr port"
$B rm -f /etc/resolv.conf
if [ "$COMPASS_EGRESS" = firewall ]; then
  . /.compass/firewall.env || die "read firewall.env"
  printf 'nameserver %s\nnameserver %s\n' "$FW_GW4" "$FW_GW6" > /etc/resolv.conf ||
    die "write /etc/resolv.conf"
else
  port compass.boundary && BOX=$P || die "no boundary port"
  echo "nameserver 100.127.255.253" > /etc/resolv.conf || die "write /etc/resolv.conf"
fi
$B chmod 0600 /dev/net/tun || die "chmod /dev/net/tun"
control() {
  while read -r cmd seq batch; do
    case $cmd in
      stop)
        # Mark first, then look for the pid; the starter writes the pid, then looks for the
        # mark: whatever the interleaving, one of the two sends the TERM (maybe both).
        : > /.compass/stopped
        if read -r a < /.compass/agent.pid 2>/dev/null; then kill -TERM "$a"; fi ;;
      allow)
        printf '%s\n' "$batch" | nft -f - > /dev/console 2>&1
        echo "allowed $seq $?" >&3 ;;
    esac
  done <&3
}
control &
HOME=/
while IFS=: read -r _ _ uid _ _ home _; do
  [ "$uid" = "$COMPASS_UID" ] && { [ -d "$home" ] && HOME=$home; break; }
done < /etc/passwd
export HOME PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ -n "$COMPASS_PIDS" ]; then ulimit -u "$COMPASS_PIDS" || die "ulimit -u $COMPASS_PIDS"; fi
cd "$COMPASS_WORKDIR" || die "--workdir $COMPASS_WORKDIR: no such directory in the root"
USER_IDS="$COMPASS_UID:$COMPASS_GID"
unset COMPASS_UID COMPASS_GID COMPASS_PIDS COMPASS_WORKDIR n p P i
log "stage 2: starting the agent as $USER_IDS"
echo up >&3
# The agent gets no user namespaces (an unprivileged way to the kernel's whole surface).
echo 0 > /proc/sys/user/max_user_namespaces || die "user.max_user_namespaces=0"
# 3>&-: the control port stays with this script; the agent must not report its own status.
if [ "$COMPASS_EGRESS" = firewall ]; then
  /.compass/nano-init supervise --user "$USER_IDS" -- "$@" </dev/null >"$OUT" 2>"$ERR" 3>&- &
else
  /.compass/nano-init run --user "$USER_IDS" "h2+dev://$BOX" "$@" </dev/null >"$OUT" 2>"$ERR" 3>&- &
fi
pid=$!
echo $pid > /.compass/agent.pid
[ -e /.compass/stopped ] && kill -TERM $pid
wait $pid
rc=$?
log "stage 2: the agent exited with status $rc; powering off"
echo "exit $rc" >&3
$B sync
$B poweroff -f
$B reboot -f
)SH";

}  // namespace

std::string_view guestLibScript() { return kGuestLib; }
std::string_view stage1Script() { return kStage1; }
std::string_view stage2Script() { return kStage2; }
std::string_view fstabEarly() { return kFstabEarly; }
std::string_view fstabRoot() { return kFstabRoot; }
std::string_view fstabNew() { return kFstabNew; }

}  // namespace runner::microvm
