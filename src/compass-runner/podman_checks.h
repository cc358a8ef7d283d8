#pragma once
// The podman tier's checks of a request (issue 4: bad input gets a clear error that names the
// flag): before the start (--sidecar-socket, --rootfs and its --workdir), and after `podman
// run` failed, what podman's failure means for the request (a missing image, a --workdir the
// image does not hold) so that it is refused (exit 2) rather than reported as the runner's own
// failure.

#include <string>

#include "compass-runner/backend.h"

namespace runner::podman {

/// --sidecar-socket: only with egress boundary (sam-box serves mesh.sam.alt), naming a Unix
/// socket that exists now, and with --bundle (without an agent identity the boundary refuses
/// every request to the node). Throws RunnerError naming the flag and the fix.
void validateSidecar(const AgentSpec& spec);

/// --rootfs DIR is a directory, and --workdir (if any) a directory inside it, symlinks resolved
/// within DIR (image.h isDirectoryIn()); a --workdir in what the runtime makes in every
/// container (/dev, /proc, /sys and below, /run, /run/sam) is left to podman. Nothing without
/// --rootfs. Throws RunnerError naming the flag.
void checkRootfs(const AgentSpec& spec);

/// After `podman run --pull never` exited 125 (podman-run(1)): throws SpecRefused("--image …:
/// no such image", with how to build the default one when `default_image`) if podman has no
/// such image; returns otherwise, and if podman cannot be asked (that is noted on stderr).
void refuseIfImageMissing(const std::string& image, bool default_image);

/// After `podman run` exited 126 before the container started: throws SpecRefused("--workdir
/// DIR: no such directory in image …") if the image holds no such directory (image.h
/// hasDirectory(): two podman starts); returns otherwise, and without a workdir.
void refuseIfWorkdirMissing(const std::string& image, const std::string& workdir);

}  // namespace runner::podman
