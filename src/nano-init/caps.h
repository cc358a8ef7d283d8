#pragma once
// The agent runs with no capability at all (issue 3 "PID 1 duties"): in particular not
// CAP_NET_ADMIN, which would let it reconfigure tun0 or add a NIC route around the boundary.

namespace nanoinit::caps {

/// In the forked child, just before exec: clears the bounding set, the ambient set and the
/// effective/permitted/inheritable sets, and sets no_new_privs so that no setuid binary or
/// file capability can give any back. Throws StepError on any failure (the child then exits
/// instead of running with a capability).
void dropAll();

/// In the forked child, before dropAll(): becomes `uid`:`gid` with no supplementary groups
/// (setgroups(2), setgid(2), setuid(2)), clearing the bounding set first if CAP_SETPCAP is
/// held (`nano-init run --user`, used where nano-init is root, e.g. PID 1 of a microVM
/// guest). Where groups cannot be dropped (no CAP_SETGID, or setgroups denied in this user
/// namespace), `uid`:`gid` naming our own ids is taken only if no other group is held.
/// Throws StepError on any failure.
void becomeUser(unsigned uid, unsigned gid);

/// In nano-init itself, once its namespaces are made and before the agent is forked:
/// prctl(PR_SET_DUMPABLE, 0) (prctl(2)), so an agent that shares nano-init's uid (the podman
/// tier runs both as uid 1000) cannot ptrace it, read its memory or copy its descriptors (tun0,
/// the boundary) with pidfd_getfd(2) or /proc/1/fd. The agent's own exec makes it dumpable
/// again. Not before the namespaces: a non-dumpable process's /proc/self/uid_map is root's.
/// Throws StepError on failure.
void protectFromAgent();

/// Whether this process is uid 0 of the machine: its real, effective or saved uid is 0 and
/// uid 0 maps to uid 0 of the parent user namespace (/proc/self/uid_map, user_namespaces(7):
/// the initial namespace, or one made by `unshare -r` as root; unreadable counts as yes),
/// whatever its capabilities. An agent left at that uid owns every root-owned file it can see
/// and may signal every root process, capabilities or not. A container's root is this too
/// unless the container has a user namespace of its own. Never throws.
bool isMachineRoot();

/// Whether capability `cap` (a CAP_* number, capabilities(7)) is in the effective set: with
/// CAP_SYS_ADMIN, unshare(2) of network and mount namespaces needs no user namespace. Throws
/// StepError if capget(2) fails.
bool hasCap(int cap);

/// The calling process's effective capability mask (for tests and logs).
unsigned long long effective();

}  // namespace nanoinit::caps
