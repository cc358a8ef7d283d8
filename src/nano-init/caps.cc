#include "nano-init/caps.h"

#include <grp.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "nano-init/errors.h"

namespace nanoinit::caps {
namespace {

// libcap ships no static archive in Debian, so the raw syscalls (capset(2) has no glibc
// wrapper).
int capget(cap_user_header_t hdr, cap_user_data_t data) {
  return static_cast<int>(::syscall(SYS_capget, hdr, data));
}
int capset(cap_user_header_t hdr, const cap_user_data_t data) {
  return static_cast<int>(::syscall(SYS_capset, hdr, data));
}

int lastCap() {
  std::ifstream in("/proc/sys/kernel/cap_last_cap");
  int last = CAP_LAST_CAP;
  if (!(in >> last)) last = CAP_LAST_CAP;
  return last;
}

}  // namespace

unsigned long long effective() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (capget(&hdr, data) != 0) throwErrno("capget");
  return (static_cast<unsigned long long>(data[1].effective) << 32) | data[0].effective;
}

bool isMachineRoot() {
  if (::geteuid() != 0) return false;
  // The initial user namespace maps every id to itself: one line "0 0 4294967295". A file
  // that cannot be read proves nothing (no /proc in a chroot): then uid 0 counts as root.
  std::ifstream in("/proc/self/uid_map");
  unsigned long long inside = 1, outside = 1, count = 0;
  std::string rest;
  if (!(in >> inside >> outside >> count)) return true;
  const bool identity = inside == 0 && outside == 0 && count == 4294967295ULL;
  return identity && !(in >> rest);
}

bool hasSysAdmin() { return (effective() & (1ULL << CAP_SYS_ADMIN)) != 0; }

void dropAll() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (capget(&hdr, data) != 0) throwErrno("capget");
  const bool have_setpcap = (data[0].effective & (1U << CAP_SETPCAP)) != 0;
  // Bounding set first (needs CAP_SETPCAP, which the next step removes). Without
  // CAP_SETPCAP the process holds no capability to lose here; no_new_privs then blocks
  // setuid and file capabilities, which is what the bounding set would have limited.
  if (have_setpcap) {
    for (int cap = 0; cap <= lastCap(); ++cap) {
      if (::prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1 &&
          ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
        throwErrno("prctl(PR_CAPBSET_DROP, " + std::to_string(cap) + ")");
      }
    }
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) {
    throwErrno("prctl(PR_CAP_AMBIENT_CLEAR_ALL)");
  }
  __user_cap_data_struct none[2]{};
  if (capset(&hdr, none) != 0) throwErrno("capset(0)");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throwErrno("prctl(PR_SET_NO_NEW_PRIVS)");
}

namespace {
// /proc/self/setgroups says "deny" (user_namespaces(7)).
bool setgroupsDenied() {
  std::ifstream in("/proc/self/setgroups");
  std::string word;
  return (in >> word) && word == "deny";
}
}  // namespace

void becomeUser(unsigned uid, unsigned gid) {
  // Bounding set while CAP_SETPCAP is still held; setuid() below clears the rest.
  for (int cap = 0; cap <= lastCap(); ++cap) {
    if (::prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1 &&
        ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      throwErrno("prctl(PR_CAPBSET_DROP, " + std::to_string(cap) + ")");
    }
  }
  if (::setgroups(0, nullptr) != 0) {
    // In a user namespace made with setgroups(2) denied (what --create-namespaces makes
    // without CAP_SYS_ADMIN) the groups cannot change: --user naming our own ids then keeps
    // them, as no --user does. Any other id is a real change and must not half-happen.
    const bool own_ids = uid == ::geteuid() && gid == ::getegid();
    if (!(errno == EPERM && own_ids && setgroupsDenied())) throwErrno("setgroups(0)");
  }
  if (::setresgid(gid, gid, gid) != 0) throwErrno("setresgid(" + std::to_string(gid) + ")");
  if (::setresuid(uid, uid, uid) != 0) throwErrno("setresuid(" + std::to_string(uid) + ")");
}

void protectFromAgent() {
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) throwErrno("prctl(PR_SET_DUMPABLE, 0)");
}

}  // namespace nanoinit::caps
