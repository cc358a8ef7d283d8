// Placeholder until the podman tier lands (issue 4): refuses, never pretends.
#include "compass-runner/backend.h"

namespace runner {
std::unique_ptr<Backend> makePodmanBackend() {
  throw RunnerError("backend podman: not built yet in this tree");
}
}  // namespace runner
