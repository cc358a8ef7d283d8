// Placeholder until the host tier lands (issue 4): refuses, never pretends.
#include "compass-runner/backend.h"

namespace runner {
std::unique_ptr<Backend> makeHostBackend() {
  throw RunnerError("backend host: not built yet in this tree");
}
}  // namespace runner
