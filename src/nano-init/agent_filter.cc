#include "nano-init/agent_filter.h"

#include <sched.h>
#include <seccomp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace nanoinit {

std::string installAgentFilter() {
  const std::unique_ptr<void, decltype(&seccomp_release)> ctx(seccomp_init(SCMP_ACT_ALLOW),
                                                              seccomp_release);
  if (!ctx) return "seccomp_init failed";
  const auto failed = [](const char* what, int rc) {
    return std::string(what) + ": " + std::strerror(-rc);
  };
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
      rc != 0) {
    return failed("seccomp_attr_set(SCMP_FLTATR_ACT_BADARCH)", rc);
  }
  // Argument 0 of socket() (the domain), of unshare() and of clone() (the flags, on x86-64).
  const scmp_arg_cmp is_vsock{0, SCMP_CMP_EQ, AF_VSOCK, 0};
  const scmp_arg_cmp wants_newuser{0, SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER};
  if (int rc =
          seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1, is_vsock);
      rc != 0) {
    return failed("seccomp_rule_add(socket AF_VSOCK)", rc);
  }
  if (int rc =
          seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1, wants_newuser);
      rc != 0) {
    return failed("seccomp_rule_add(unshare CLONE_NEWUSER)", rc);
  }
  if (int rc =
          seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, wants_newuser);
      rc != 0) {
    return failed("seccomp_rule_add(clone CLONE_NEWUSER)", rc);
  }
  if (int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0); rc != 0) {
    return failed("seccomp_rule_add(clone3)", rc);
  }
  if (int rc = seccomp_load(ctx.get()); rc != 0) return failed("seccomp_load", rc);
  return "";
}

}  // namespace nanoinit
