// Placeholder until egress `firewall` lands (issue 4): refuses, never fails open.
#include "compass-runner/firewall.h"

#include "compass-runner/backend.h"

namespace runner::firewall {
std::unique_ptr<Egress> arm(const std::string&, const std::string&,
                            const std::vector<std::string>&) {
  throw RunnerError("egress firewall: not built yet in this tree");
}
void reap(const std::string&) noexcept {}
}  // namespace runner::firewall
