// A query to the firewall's DNS forwarder is the agent's own bytes: answerQuery() must answer
// every input without crashing, never resolve a name the allowlist does not hold, never answer
// an address it did not first admit, never answer a forbidden address, and keep UDP replies
// within 512 bytes.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "compass-runner/dns_answer.h"
#include "policy/address.h"

namespace {

using runner::firewall::AllowElement;
using runner::firewall::Resolution;

const policy::Allowlist& allowlist() {
  static const policy::Allowlist list = [] {
    policy::Allowlist l;
    for (const char* e : {"allowed.example", "*.wild.example", "api.example:443", "loop.example"}) {
      l.add(policy::parseAllowRule(e));
    }
    return l;
  }();
  return list;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view query(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> resolved;
  std::vector<AllowElement> admitted;
  runner::firewall::AnswerContext ctx;
  ctx.allow = &allowlist();
  ctx.resolve = [&](const std::string& name) {
    resolved.push_back(name);
    Resolution r;
    r.status = Resolution::Status::kOk;
    // Good and forbidden addresses mixed, more than the answer cap.
    for (const char* a : {"198.51.100.7", "127.0.0.1", "169.254.169.254", "2001:db8::7", "::1",
                          "::ffff:127.0.0.1", "fe80::1", "10.231.0.1", "0.0.0.0"}) {
      r.addresses.push_back(asio::ip::make_address(a));
    }
    for (int i = 1; i <= 20; ++i) {
      r.addresses.push_back(asio::ip::make_address("198.51.100." + std::to_string(100 + i)));
    }
    return r;
  };
  ctx.admit = [&](const std::vector<AllowElement>& e) {
    admitted.insert(admitted.end(), e.begin(), e.end());
    return true;
  };
  const auto a = runner::firewall::answerQuery(query, ctx);

  if (!a.reply.empty()) {
    if (a.reply.size() < 12 || a.reply.size() > runner::firewall::kMaxUdpReply) __builtin_trap();
    if (a.reply[0] != query[0] || a.reply[1] != query[1]) __builtin_trap();  // ID echoed
    if ((static_cast<uint8_t>(a.reply[2]) & 0x80) == 0) __builtin_trap();    // QR set
  }
  if (!resolved.empty()) {
    if (resolved.size() != 1 || resolved[0] != a.name) __builtin_trap();
    if (!runner::firewall::allowedPorts(allowlist(), a.name)) __builtin_trap();
  }
  if (a.answered.size() > runner::firewall::kMaxAnswerAddresses) __builtin_trap();
  for (const auto& addr : a.answered) {
    if (policy::isForbiddenAddress(addr) || runner::firewall::inPools(addr)) __builtin_trap();
    bool opened = false;
    for (const auto& e : admitted) opened = opened || e.address == addr;
    if (!opened) __builtin_trap();
  }
  if (!a.reply.empty()) {
    // Every reply is a well-formed message (glibc's parser takes it), and what the agent reads
    // back is exactly what was answered.
    runner::firewall::ParsedReply parsed;
    try {
      parsed = runner::firewall::parseReply(a.reply);
    } catch (const std::invalid_argument&) {
      __builtin_trap();
    }
    if (parsed.rcode != a.rcode) __builtin_trap();
    if (!parsed.truncated && parsed.addresses != a.answered) __builtin_trap();
  }
  return 0;
}
