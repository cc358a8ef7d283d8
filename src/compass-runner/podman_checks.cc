// The podman tier's checks of a request (podman_checks.h).
#include "compass-runner/podman_checks.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>

#include "compass-runner/image.h"
#include "compass-runner/podman_cli.h"

namespace runner::podman {

void validateSidecar(const AgentSpec& spec) {
  if (spec.sidecar_socket.empty()) return;
  if (spec.egress.value_or(Posture::kBoundary) == Posture::kFirewall) {
    throw RunnerError(
        "--sidecar-socket: egress firewall has no boundary to reach the node "
        "through (mesh.sam.alt is served by sam-box); use --egress boundary");
  }
  struct stat st {};
  if (::stat(spec.sidecar_socket.c_str(), &st) != 0) {
    throw RunnerError("--sidecar-socket " + spec.sidecar_socket + ": " + std::strerror(errno) +
                      " (start the node first: sam-node run --socket-path " + spec.sidecar_socket +
                      " --config FILE)");
  }
  if (!S_ISSOCK(st.st_mode)) {
    throw RunnerError("--sidecar-socket " + spec.sidecar_socket + ": not a Unix socket");
  }
  if (spec.bundle_path.empty()) {
    throw RunnerError(
        "--sidecar-socket needs --bundle: without an agent identity the boundary refuses "
        "mesh.sam.alt (no-agent-identity), so the node could never be reached");
  }
}

namespace {

// Directories the container runtime makes or mounts in every container, whatever its root
// holds: the kernel's file systems, /run (podman's .containerenv) and the runner's own
// /run/sam. Whether a --workdir in them exists is left to podman.
bool madeByTheRuntime(const std::string& workdir) {
  std::string dir;  // without repeated or trailing slashes and "." ("//run/./sam/" is /run/sam)
  std::string top;  // its first component
  for (const auto& part : std::filesystem::path(workdir).relative_path()) {
    if (part.empty() || part == ".") continue;
    if (top.empty()) top = part.string();
    dir += "/" + part.string();
  }
  return top == "dev" || top == "proc" || top == "sys" || dir == "/run" ||
         dir == kSandboxBoundaryDir;
}

}  // namespace

void checkRootfs(const AgentSpec& spec) {
  if (spec.rootfs.empty()) return;
  struct stat st {};
  if (::stat(spec.rootfs.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw RunnerError("--rootfs " + spec.rootfs + ": not a directory");
  }
  if (spec.workdir.empty() || madeByTheRuntime(spec.workdir)) return;
  bool found = false;
  try {
    found = image::isDirectoryIn(spec.rootfs, spec.workdir);
  } catch (const std::exception& e) {
    throw RunnerError("--workdir: cannot look it up in --rootfs: " + std::string(e.what()));
  }
  if (!found) {
    throw RunnerError("--workdir " + spec.workdir + ": no such directory in --rootfs " +
                      spec.rootfs);
  }
}

void refuseIfImageMissing(const std::string& image, bool default_image) {
  if (image.empty()) return;  // --rootfs
  bool missing = false;
  try {
    missing = !image::exists(image);
  } catch (const std::exception& e) {
    note(std::string("could not tell whether the image exists: ") + e.what());
  }
  if (!missing) return;
  throw SpecRefused("--image " + image + ": no such image" +
                    (default_image ? "; run `compass-runner image build` first"
                                   : " (no registry is reachable: build or import it)"));
}

void refuseIfWorkdirMissing(const std::string& image, const std::string& workdir) {
  if (image.empty() || workdir.empty()) return;  // --rootfs: checked before the start
  bool missing = false;
  try {
    missing = !image::hasDirectory(image, workdir);
  } catch (const std::exception& e) {
    note(std::string("could not tell whether --workdir is in the image: ") + e.what());
  }
  if (!missing) return;
  throw SpecRefused("--workdir " + workdir + ": no such directory in image " + image);
}

}  // namespace runner::podman
