#pragma once
// /etc/resolv.conf inside the sandbox must name only the virtual DNS (seed 003), and /etc/hosts
// must not give names addresses of its own. Where the
// file already does (the seed's pod mounts it per container), nothing is touched: the bind
// mount is the one operation containerd's default AppArmor profile denies.

#include <string>

namespace nanoinit::resolv {

/// True if `content` names exactly one nameserver and it is vdns::kResolverAddress.
bool alreadyPointsAtVirtualDns(const std::string& content);

/// The generated file.
std::string generated();

enum class Outcome { kAlreadyRight, kBindMounted, kSkipped };

/// True if every entry of the hosts(5) text `hosts` maps to a loopback address: then no name
/// in it bypasses the virtual DNS.
bool onlyLoopback(const std::string& hosts);

/// The generated /etc/hosts: localhost only.
std::string generatedHosts();

/// Makes `path` point at the virtual DNS: leaves it if already right; else, if
/// `own_mount_namespace`, bind-mounts a generated file over it (read-only); else skips.
/// `*note` explains a skip, or a bind that could not be made read-only. Throws StepError if
/// the bind mount fails.
Outcome ensure(const std::string& path, bool own_mount_namespace, std::string* note);

/// The same for /etc/hosts: a file whose names all map to loopback (or none) is left alone;
/// else, with `own_mount_namespace`, generatedHosts() is bind-mounted over it (a host's names
/// would give the agent real addresses, which the boundary refuses as unresolved-address, or
/// loopback ones inside the sandbox); else skipped with `*note`.
Outcome ensureHosts(const std::string& path, bool own_mount_namespace, std::string* note);

}  // namespace nanoinit::resolv
