// Bundle YAML comes from outside the sandbox but not always from a trusted writer; whatever
// the bytes, parseBundle() must refuse with BundleError and never crash, hang or throw
// anything else.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "policy/bundle.h"
#include "policy/name.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const policy::Bundle bundle = policy::parseBundle(text);
    // What was accepted must already be in normal form: a second pass changes nothing.
    if (policy::normalizeName(bundle.agent_id) != bundle.agent_id) __builtin_trap();
    for (const auto& rule : bundle.egress_allow) {
      if (policy::parseAllowRule(rule.text()).text() != rule.text()) __builtin_trap();
    }
    if (bundle.serves && bundle.serves->port == 0) __builtin_trap();
  } catch (const policy::BundleError&) {
  }
  return 0;
}
