// A CONNECT authority is the agent's own text: parseAuthority(), normalizeName() and
// isIpLiteral() must agree with each other on every input and never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "policy/allowlist.h"
#include "policy/name.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string reason;
  (void)policy::isIpLiteral(text);
  if (auto name = policy::normalizeName(text, &reason)) {
    // A name is never also an address, and normalizing is idempotent.
    if (policy::isIpLiteral(*name)) __builtin_trap();
    if (policy::normalizeName(*name) != *name) __builtin_trap();
  } else if (reason.empty()) {
    __builtin_trap();
  }
  reason.clear();
  const auto authority = policy::parseAuthority(text, &reason);
  if (!authority) {
    if (reason.empty()) __builtin_trap();
    return 0;
  }
  if (authority->port == 0) __builtin_trap();
  if (const auto name = policy::normalizeName(authority->host)) {
    // An allowlist naming exactly this host must allow it, and a wildcard for it must not.
    policy::Allowlist exact;
    exact.add(policy::parseAllowRule(*name));
    if (!exact.allows(*name, authority->port)) __builtin_trap();
    policy::Allowlist wildcard;
    wildcard.add(policy::parseAllowRule("*." + *name));
    if (wildcard.allows(*name, authority->port)) __builtin_trap();
  }
  return 0;
}
