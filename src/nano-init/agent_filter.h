// The seccomp filter nano-init puts on the agent just before it executes it: what no egress
// rule can see stays shut even where the container runtime's own profile allows it.
#pragma once

#include <string>

namespace nanoinit {

/// Installs on the calling process (the agent's child, after fork(), right before execve())
/// a seccomp(2) filter, built with libseccomp, inherited by everything the agent starts and
/// impossible for it to remove. Every other system call is allowed; these fail:
/// - socket(AF_VSOCK, …) with EAFNOSUPPORT: vsock(7) is not covered by network namespaces or
///   nftables, so a host or hypervisor vsock service would be a way around tun0 and the
///   firewall alike;
/// - unshare(2) and clone(2) with CLONE_NEWUSER with EPERM, and clone3(2) with ENOSYS (its
///   flags are in memory a filter cannot read; glibc then falls back to clone(2)): a user
///   namespace gives an unprivileged agent its own nf_tables and netlink, the usual start of a
///   kernel privilege escalation (the microVM guest turns them off with
///   user.max_user_namespaces=0 as well);
/// - a system call of another ABI (i386, x32) kills the process, so that the rules above
///   cannot be bypassed through another numbering.
/// Sets PR_SET_NO_NEW_PRIVS (seccomp(2) needs it without CAP_SYS_ADMIN). Async-signal-safety:
/// libseccomp allocates, which is safe in nano-init's single-threaded child. Returns "" or the
/// failing libseccomp call with its error.
std::string installAgentFilter();

}  // namespace nanoinit
