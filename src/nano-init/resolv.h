#pragma once
// /etc/resolv.conf inside the sandbox must name only the virtual DNS (seed 003). Where the
// file already does (the seed's pod mounts it per container), nothing is touched: the bind
// mount is the one operation containerd's default AppArmor profile denies.

#include <string>

namespace nanoinit::resolv {

/// True if `content` names exactly one nameserver and it is vdns::kResolverAddress.
bool alreadyPointsAtVirtualDns(const std::string& content);

/// The generated file.
std::string generated();

enum class Outcome { kAlreadyRight, kBindMounted, kSkipped };

/// Makes `path` point at the virtual DNS: leaves it if already right; else, if
/// `own_mount_namespace`, bind-mounts a generated file over it; else skips. `*note` explains
/// a skip. Throws StepError if a mount it attempts fails.
Outcome ensure(const std::string& path, bool own_mount_namespace, std::string* note);

}  // namespace nanoinit::resolv
