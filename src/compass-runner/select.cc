// The seed's SelectBackend (seed 002, "The tiers"): the one place a tier name becomes a Backend.
#include "compass-runner/backend.h"

namespace runner {

std::string_view postureName(Posture p) {
  switch (p) {
    case Posture::kBoundary:
      return "boundary";
    case Posture::kFirewall:
      return "firewall";
    case Posture::kUnenforced:
      return "unenforced";
  }
  return "unenforced";  // unreachable: every enumerator is handled above
}

const std::vector<std::string>& validBackendNames() {
  static const std::vector<std::string> kNames = {"podman", "microvm", "host", "apple-container"};
  return kNames;
}

std::unique_ptr<Backend> selectBackend(const std::optional<std::string>& flag, const char* env) {
  // The flag wins when set, even when set to "" (which means the default, as unset does).
  std::string name;
  std::string source;
  if (flag) {
    name = *flag;
    source = "--backend";
  } else if (env != nullptr) {
    name = env;
    source = "COMPASS_RUNTIME_BACKEND";
  }
  if (name.empty() || name == "podman") return makePodmanBackend();
  if (name == "microvm") return makeMicrovmBackend();
  if (name == "host") return makeHostBackend();
  if (name == "apple-container") {
    throw RunnerError(source +
                      " apple-container: that backend is the macOS container runtime and needs "
                      "macOS; on Linux use podman (the default) or host");
  }
  std::string valid;
  for (const auto& n : validBackendNames()) valid += (valid.empty() ? "" : ", ") + n;
  throw RunnerError(source + " \"" + name + "\": unknown backend; valid names are " + valid +
                    " (empty means podman)");
}

}  // namespace runner
