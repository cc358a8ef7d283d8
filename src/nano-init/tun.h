#pragma once
// tun0: the sandbox's only route out (issue 3 "Network"). nano-init either adopts a tun0 its
// launcher made (an fd passed as 3 or through the exec gate, or a persistent tun0 in this netns
// that it may attach to) or creates one, which needs CAP_NET_ADMIN over the netns and access to
// /dev/net/tun.

#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace nanoinit::tun {

inline constexpr const char* kName = "tun0";
/// The descriptor a launcher may pass an open tun0 on (podman --preserve-fds 1).
inline constexpr int kInheritedFd = 3;

/// Refuses (StepError) a network namespace holding any interface but lo and tun0: the agent
/// could route around the boundary through it, and nano-init would otherwise take over the
/// default routes of a namespace it does not own (the host's, if started there by mistake).
void requireIsolatedNamespace();

/// Returns an open IFF_TUN | IFF_NO_PI descriptor for tun0 (O_CLOEXEC): `passed` if valid (the
/// tun0 that came through the exec gate; StepError if it is not an attached tun0), else an
/// inherited fd 3 that is tun0, else a tun0 it creates (StepError naming the failing call).
common::UniqueFd openTun(common::UniqueFd passed = {});

/// lo up; tun0 up with its IPv4 and IPv6 addresses; IPv4 and IPv6 default routes via tun0.
/// If all of that is already in place (a launcher such as compass-runner's podman tier did it,
/// since the container holds no CAP_NET_ADMIN), nothing is changed. Otherwise nano-init adds
/// what is missing; if it cannot (EPERM), throws StepError naming every missing piece.
void configureNetwork();

/// The interfaces whose default route (destination and mask 0, RTF_UP, not RTF_REJECT) is in
/// `text`, in /proc/net/route format (proc(5)). Pure.
std::vector<std::string> defaultRoutes4(const std::string& text);

/// The same for /proc/net/ipv6_route text (destination ::/0). Pure.
std::vector<std::string> defaultRoutes6(const std::string& text);

}  // namespace nanoinit::tun
