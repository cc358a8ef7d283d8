// The microvm tier is issue 5. Until it lands, selecting it is refused with that reason.
#include "compass-runner/backend.h"

namespace runner {
std::unique_ptr<Backend> makeMicrovmBackend() {
  throw RunnerError(
      "backend microvm: not available in this build (the QEMU microVM tier is not built "
      "yet); use --backend podman");
}
}  // namespace runner
