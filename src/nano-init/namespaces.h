#pragma once
// --create-namespaces (seed 003, Kubernetes): a user namespace first, in which nano-init holds
// CAP_SYS_ADMIN and CAP_NET_ADMIN over what it creates next, then a network namespace that
// will hold only lo and tun0, and a mount namespace of its own (for /etc/resolv.conf).

#include <string>

namespace nanoinit::namespaces {

/// unshare(CLONE_NEWUSER) and map the caller's own uid and gid (one each; what an
/// unprivileged process may map). The agent keeps its uid; capabilities are dropped later.
void enterUserNamespace();

/// unshare(CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS): a fresh network namespace with only a
/// down lo, and IPC and UTS namespaces of its own (a pod shares both between containers).
void enterNetworkNamespace();

/// unshare(CLONE_NEWNS) and make every mount private, so nothing nano-init mounts (the
/// resolv.conf bind) propagates back. Returns false (with the reason in *why) if not
/// permitted: then nano-init does not own a mount namespace and mounts nothing.
bool enterMountNamespace(std::string* why);

}  // namespace nanoinit::namespaces
