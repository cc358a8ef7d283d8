#pragma once
// The podman tier (seed 002, "podman"; issue 4 "podman tier"): one rootful podman container
// per agent (runtime runc, our containers.conf), in its own user namespace (host ids from
// podman_userns.h), joined to a netns the runner made and armed itself:
//
//   egress boundary (default)        egress firewall
//   netns: lo + tun0 (fd → nano-init)  netns: lo + veth, nft ruleset (firewall.h)
//   sam-box on <state>/sam/agent.sock  the runner's DNS forwarder as the sandbox's resolver
//   entry: nano-init run --gate-fd 3   entry: nano-init supervise --gate-fd 3
//          --lifeline SOCK CMD…               --lifeline -- CMD…
//
// In both the agent runs as uid 1000 (host uid = its range's base + 1000), with no
// capability, no_new_privs and no terminal; the container never holds CAP_NET_ADMIN. See
// makePodmanBackend() in backend.h for the factory; the rest of the tier is in the files
// named below.

#include <chrono>
#include <string>

#include "compass-runner/backend.h"

namespace runner::podman {

/// The directory of the agent's state dir that the container mounts read-only at /run/sam
/// (podman_cli.h kSandboxBoundaryDir): sam-box's socket, and the mount point of nano-init.
inline constexpr const char* kBoundaryDir = "sam";
/// Where the sam-box socket lives in the agent's state dir (its log: sam_box_process.h).
inline constexpr const char* kSocketFile = "sam/agent.sock";
/// The empty file in kBoundaryDir that nano-init is mounted on.
inline constexpr const char* kNanoInitMountPoint = "nano-init";
inline constexpr const char* kPidFile = "container.pid";
/// How long sam-box may take to create its socket before the start fails.
inline constexpr std::chrono::seconds kSamBoxStartTimeout{5};
/// How long `podman run` may take to start the container (the first run with a new id range
/// may copy the image's layer to chown it).
inline constexpr std::chrono::seconds kContainerStartTimeout{120};
/// The agent's user inside the container ("uid:gid").
inline constexpr const char* kAgentUser = "1000:1000";

/// The nano-init binary: $COMPASS_NANO_INIT, else next to compass-runner (sam_box_process.h
/// findCompanion()). Throws RunnerError naming where it looked, or if that file is not a
/// statically linked ELF (elf_check.h): the sandbox's first process must load nothing of the
/// sandbox's.
std::string findNanoInit();

}  // namespace runner::podman
