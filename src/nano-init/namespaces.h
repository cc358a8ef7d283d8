#pragma once
// --create-namespaces (seed 003, Kubernetes): a user namespace first, in which nano-init holds
// CAP_SYS_ADMIN and CAP_NET_ADMIN over what it creates next, then a network namespace that
// will hold only lo and tun0, and a mount namespace of its own (for /etc/resolv.conf).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace nanoinit::namespaces {

/// When nano-init is not PID 1 (a by-hand launch): unshare(CLONE_NEWPID) and fork, so the
/// set-up and the agent go on in a child that is PID 1 of a PID namespace of its own. The
/// agent then cannot name nano-init to signal it (as PID 1 it ignores what it has no handler
/// for, and SIGKILL from inside), and when that PID 1 ends the kernel kills whatever is left
/// of the agent's, setsid'd or not (pid_namespaces(7)). Returns in the child (with
/// PR_SET_PDEATHSIG SIGKILL). The parent never returns: it forwards kForwardedSignals to the
/// child and exits with the child's status (128+N if a signal ended it), and is not dumpable.
/// Throws StepError if unshare or fork fails.
void enterPidNamespace();

/// In the PID namespace's PID 1, with a mount namespace of its own: mounts a procfs of that
/// PID namespace on /proc, so the agent lists only the sandbox's processes. False (with the
/// reason in *why) where the kernel refuses (a container's masked /proc).
bool mountOwnProc(std::string* why);

/// unshare(CLONE_NEWUSER) and map the caller's own uid and gid (one each; what an
/// unprivileged process may map). The agent keeps its uid; capabilities are dropped later.
/// `user` (--user), if given, must be nano-init's own ids: nothing else can be mapped here.
/// Throws StepError otherwise, or if unshare or a map write fails.
void enterUserNamespace(const std::optional<std::pair<uint32_t, uint32_t>>& user);

/// unshare(CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS): a fresh network namespace with only a
/// down lo, and IPC and UTS namespaces of its own (a pod shares both between containers).
void enterNetworkNamespace();

/// unshare(CLONE_NEWNS) and make every mount private, so nothing nano-init mounts (the
/// resolv.conf bind) propagates back. Returns false (with the reason in *why) if not
/// permitted: then nano-init does not own a mount namespace and mounts nothing.
bool enterMountNamespace(std::string* why);

}  // namespace nanoinit::namespaces
