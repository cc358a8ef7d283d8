#pragma once
// The microVM guest's launch step (issue 5), as text the runner puts in the initramfs
// (microvm_initramfs.h): two busybox-sh stages, the library both source, and stage 1's mount
// tables. What each stage does, and the control-port protocol, are in microvm_initramfs.h and
// microvm_control.h; docs/compass-runner.md "microvm tier" has the boot sequence.

#include <string_view>

namespace runner::microvm {

/// /compass/lib.sh: log, die (says "fail REASON" on the control port, powers off), port
/// (finds a virtio-serial port by name), nft (the copied nft with its own loader).
std::string_view guestLibScript();
/// /init: PID 1 in the initramfs (modules, control port, egress firewall, root, switch).
std::string_view stage1Script();
/// /compass/stage2: PID 1 in the agent's root (resolver, control loop, the agent, exit).
std::string_view stage2Script();
/// Stage 1's `mount -a -T` tables: early (proc, sys, dev, scratch tmpfs), root (erofs and
/// overlay), new (proc, sys, dev, pts, shm and the launch step inside the root).
std::string_view fstabEarly();
std::string_view fstabRoot();
std::string_view fstabNew();

}  // namespace runner::microvm
