#pragma once
// Who may use what (seed 003, "Two agents behind the same node can see different tool
// lists, because the mesh answers according to who is asking"). Pure functions of the
// Config: an agent's grants are the union of every role whose allowed_agents match its id.
// An id that is not a valid name (policy::normalizeName) matches nothing.

#include "sam-node/config.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace samnode {

class Grants {
 public:
  /// Keeps a reference: `config` must outlive this object.
  explicit Grants(const Config& config);

  /// Names of the roles that match `agent` (for logs).
  [[nodiscard]] std::vector<std::string> roles(std::string_view agent) const;
  [[nodiscard]] bool mayUseService(std::string_view agent, std::string_view service) const;
  /// Also requires mayUseService(agent, service).
  [[nodiscard]] bool mayUseTool(std::string_view agent, std::string_view service,
                                std::string_view tool) const;
  [[nodiscard]] bool maySpawn(std::string_view agent, std::string_view tmpl) const;
  /// `host` normalized; true if a role grants `secret` with a destination matching host:port.
  [[nodiscard]] bool mayUseSecret(std::string_view agent, std::string_view secret,
                                  std::string_view host, uint16_t port) const;

 private:
  const Config& config_;
};

}  // namespace samnode
