#include "nano-init/caps.h"

#include <grp.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

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
  // Any of the three: a process whose real or saved uid is 0 can make 0 its effective uid
  // again without a capability (setresuid(2)).
  uid_t real = 1, effective_uid = 1, saved = 1;
  if (::getresuid(&real, &effective_uid, &saved) != 0) return true;
  if (real != 0 && effective_uid != 0 && saved != 0) return false;
  // uid 0 here is root of the machine if it maps to uid 0 of the parent namespace: the
  // initial namespace ("0 0 4294967295"), or one a launcher made with `unshare -r` as root
  // ("0 0 1"). Unreadable (no /proc in a chroot) proves nothing: then it counts as root.
  std::ifstream in("/proc/self/uid_map");
  if (!in) return true;
  unsigned long long inside = 0, outside = 0, count = 0;
  bool mapped = false;
  while (in >> inside >> outside >> count) {
    if (inside == 0 && count > 0) {
      mapped = true;
      if (outside == 0) return true;
    }
  }
  return !mapped;  // uid 0 unmapped here: cannot say, so root
}

bool hasCap(int cap) { return (effective() & (1ULL << cap)) != 0; }

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

// No supplementary group other than `gid` (getgroups(2)).
bool onlyGroupIs(gid_t gid) {
  const int n = ::getgroups(0, nullptr);
  if (n < 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  if (n > 0 && ::getgroups(n, groups.data()) != n) return false;
  return std::all_of(groups.begin(), groups.end(), [gid](gid_t g) { return g == gid; });
}
}  // namespace

void becomeUser(unsigned uid, unsigned gid) {
  // Bounding set while CAP_SETPCAP is still held (dropAll() empties the other sets; without
  // CAP_SETPCAP nothing can be raised from the bounding set anyway: no_new_privs).
  if (hasCap(CAP_SETPCAP)) {
    for (int cap = 0; cap <= lastCap(); ++cap) {
      if (::prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1 &&
          ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
        throwErrno("prctl(PR_CAPBSET_DROP, " + std::to_string(cap) + ")");
      }
    }
  }
  if (::setgroups(0, nullptr) != 0) {
    // No right to drop supplementary groups (no CAP_SETGID, or a user namespace with
    // setgroups denied, which --create-namespaces makes without CAP_SYS_ADMIN): --user
    // naming our own ids is kept only if there is no group besides `gid` to drop. A kept
    // group (docker, disk, adm) would give the agent what --user promises it has not.
    const int err = errno;
    const bool own_ids = uid == ::geteuid() && gid == ::getegid();
    if (!(err == EPERM && own_ids && onlyGroupIs(gid))) {
      errno = err;
      throwErrno("setgroups(0) (supplementary groups cannot be dropped here" +
                 std::string(setgroupsDenied() ? ": this user namespace denies setgroups" : "") +
                 ")");
    }
  }
  if (::setresgid(gid, gid, gid) != 0) throwErrno("setresgid(" + std::to_string(gid) + ")");
  if (::setresuid(uid, uid, uid) != 0) throwErrno("setresuid(" + std::to_string(uid) + ")");
}

void protectFromAgent() {
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) throwErrno("prctl(PR_SET_DUMPABLE, 0)");
}

}  // namespace nanoinit::caps
