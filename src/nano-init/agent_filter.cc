#include "nano-init/agent_filter.h"

#include <sched.h>
#include <seccomp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>

namespace nanoinit {

std::string installAgentFilter() {
  const std::unique_ptr<void, decltype(&seccomp_release)> ctx(seccomp_init(SCMP_ACT_ALLOW),
                                                              seccomp_release);
  if (!ctx) return "seccomp_init failed";
  const auto failed = [](const std::string& what, int rc) {
    return what + ": " + std::strerror(-rc);
  };
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
      rc != 0) {
    return failed("seccomp_attr_set(SCMP_FLTATR_ACT_BADARCH)", rc);
  }
  // Argument 0 of socket() (the domain), of unshare() and of clone() (the flags, on x86-64).
  const scmp_arg_cmp is_vsock{0, SCMP_CMP_EQ, AF_VSOCK, 0};
  const scmp_arg_cmp wants_newuser{0, SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER};
  struct Rule {
    const char* what;
    uint32_t action;
    int syscall;
    const scmp_arg_cmp* arg;  // nullptr: every call
  };
  const Rule rules[] = {
      {"socket AF_VSOCK", SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), &is_vsock},
      {"unshare CLONE_NEWUSER", SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), &wants_newuser},
      {"clone CLONE_NEWUSER", SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), &wants_newuser},
      {"clone3", SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), nullptr},
  };
  for (const Rule& r : rules) {
    const int rc = r.arg != nullptr ? seccomp_rule_add(ctx.get(), r.action, r.syscall, 1, *r.arg)
                                    : seccomp_rule_add(ctx.get(), r.action, r.syscall, 0);
    if (rc != 0) return failed(std::string("seccomp_rule_add(") + r.what + ")", rc);
  }
  if (int rc = seccomp_load(ctx.get()); rc != 0) return failed("seccomp_load", rc);
  return "";
}

}  // namespace nanoinit
