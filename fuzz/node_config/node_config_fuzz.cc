// sam-node's --config is operator input, but a bad file must be refused with a ConfigError
// naming the field, never a crash or another exception; and what is accepted must satisfy the
// rules docs/sam-node.md states (unique names, no dangling references, sane values).
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "sam-node/config.h"

namespace {

template <typename T>
bool uniqueNames(const std::vector<T>& items) {
  std::set<std::string> seen;
  for (const auto& item : items)
    if (!seen.insert(item.name).second) return false;
  return true;
}

void checkAccepted(const samnode::Config& c) {
  if (!uniqueNames(c.services) || !uniqueNames(c.secrets) || !uniqueNames(c.spawn) ||
      !uniqueNames(c.roles))
    __builtin_trap();
  if (c.probe_interval.count() < 100 || c.probe_interval.count() > 60000) __builtin_trap();
  for (const auto& s : c.services) {
    const std::string_view url = s.target_url;
    if (!url.starts_with("http://") && !url.starts_with("https://")) __builtin_trap();
    if (url.ends_with("/")) __builtin_trap();
    if (!s.api_key.empty() && s.type != samnode::ServiceType::kOpenai) __builtin_trap();
  }
  for (const auto& d : c.secrets)
    if (d.header.empty() || d.format.find("{}") == std::string::npos) __builtin_trap();
  for (const auto& t : c.spawn)
    if (t.command.empty() || t.bundle.empty() || t.bundle[0] != '/') __builtin_trap();
  for (const auto& r : c.roles) {
    for (const auto& s : r.services)
      if (c.service(s) == nullptr) __builtin_trap();
    for (const auto& g : r.tools)
      if (c.service(g.service) == nullptr) __builtin_trap();
    for (const auto& t : r.spawn)
      if (c.spawnTemplate(t) == nullptr) __builtin_trap();
    for (const auto& g : r.secrets)
      if (c.secret(g.name) == nullptr) __builtin_trap();
    for (const auto& p : r.allowed_agents) {
      if (p.name.empty()) __builtin_trap();
      // A wildcard never matches its namespace itself.
      if (p.wildcard && samnode::agentMatches(p, p.name)) __builtin_trap();
      if (!p.wildcard && !samnode::agentMatches(p, p.name)) __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    checkAccepted(samnode::parseConfig(text));
  } catch (const samnode::ConfigError& e) {
    if (std::string_view(e.what()).empty()) __builtin_trap();
  }
  // Any other exception escapes and libFuzzer reports it: the contract is ConfigError only.
  return 0;
}
