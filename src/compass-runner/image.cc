// Placeholder until `image build` lands (issue 4).
#include "compass-runner/image.h"

#include "compass-runner/backend.h"

namespace runner::image {
void build(const BuildOptions&) { throw RunnerError("image build: not built yet in this tree"); }
bool exists(const std::string&) { return false; }
}  // namespace runner::image
