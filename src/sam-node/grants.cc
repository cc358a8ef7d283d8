#include "sam-node/grants.h"

#include <optional>

#include "policy/name.h"

namespace samnode {
namespace {

// An id that is not a valid name matches no role: it cannot be confused with one that is.
std::optional<std::string> normalizedAgent(std::string_view agent) {
  if (agent.empty()) return std::nullopt;
  return policy::normalizeName(agent);
}

bool roleMatches(const Role& role, const std::string& agent) {
  for (const auto& p : role.allowed_agents)
    if (agentMatches(p, agent)) return true;
  return false;
}

// Calls `fn(role)` for each role granting `agent`; stops at the first true.
template <typename Fn>
bool anyRole(const Config& config, std::string_view agent, Fn fn) {
  const auto id = normalizedAgent(agent);
  if (!id) return false;
  for (const auto& role : config.roles)
    if (roleMatches(role, *id) && fn(role)) return true;
  return false;
}

}  // namespace

Grants::Grants(const Config& config) : config_(config) {}

std::vector<std::string> Grants::roles(std::string_view agent) const {
  std::vector<std::string> out;
  anyRole(config_, agent, [&](const Role& role) {
    out.push_back(role.name);
    return false;
  });
  return out;
}

bool Grants::mayUseService(std::string_view agent, std::string_view service) const {
  return anyRole(config_, agent, [&](const Role& role) {
    for (const auto& s : role.services)
      if (s == service) return true;
    return false;
  });
}

bool Grants::mayUseTool(std::string_view agent, std::string_view service,
                        std::string_view tool) const {
  if (!mayUseService(agent, service)) return false;
  return anyRole(config_, agent, [&](const Role& role) {
    for (const auto& g : role.tools)
      if (g.service == service && (g.tool == "*" || g.tool == tool)) return true;
    return false;
  });
}

bool Grants::maySpawn(std::string_view agent, std::string_view tmpl) const {
  return anyRole(config_, agent, [&](const Role& role) {
    for (const auto& s : role.spawn)
      if (s == tmpl) return true;
    return false;
  });
}

bool Grants::mayUseSecret(std::string_view agent, std::string_view secret, std::string_view host,
                          uint16_t port) const {
  return anyRole(config_, agent, [&](const Role& role) {
    for (const auto& g : role.secrets)
      if (g.name == secret && g.destinations.allows(host, port)) return true;
    return false;
  });
}

}  // namespace samnode
