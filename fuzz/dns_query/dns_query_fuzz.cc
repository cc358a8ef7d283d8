// A DNS query is the agent's own bytes: the virtual DNS must answer every input without
// crashing, never answer with more than it can bound, and every address it hands out must
// map back to exactly the name it was handed out for.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "vdns/virtual_dns.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A small pool, so the fuzzer reaches exhaustion and reuse too.
  static vdns::VirtualDns dns(64, std::chrono::milliseconds(0));
  const std::string_view query(reinterpret_cast<const char*>(data), size);
  const std::string r = dns.answer(query);
  if (r.empty()) return 0;
  if (r.size() < 12 || r.size() > 512) __builtin_trap();
  if ((static_cast<uint8_t>(r[2]) & 0x80) == 0) __builtin_trap();  // QR set
  if (r[0] != query[0] || r[1] != query[1]) __builtin_trap();      // ID echoed
  const int ancount = (static_cast<uint8_t>(r[6]) << 8) | static_cast<uint8_t>(r[7]);
  if (ancount > 1) __builtin_trap();
  if (ancount == 1) {
    // The answer's RDATA is the last 4 or 16 bytes before an optional 11-byte OPT.
    const int arcount = (static_cast<uint8_t>(r[10]) << 8) | static_cast<uint8_t>(r[11]);
    const size_t end = r.size() - (arcount == 1 ? 11 : 0);
    const auto get16 = [&](size_t at) {
      return (static_cast<uint8_t>(r[at]) << 8) | static_cast<uint8_t>(r[at + 1]);
    };
    asio::ip::address addr;
    if (end >= 12 + 6 && get16(end - 6) == 4) {
      asio::ip::address_v4::bytes_type b;
      for (size_t i = 0; i < 4; ++i) b[i] = static_cast<uint8_t>(r[end - 4 + i]);
      addr = asio::ip::address_v4(b);
    } else if (end >= 12 + 18 && get16(end - 18) == 16) {
      asio::ip::address_v6::bytes_type b;
      for (size_t i = 0; i < 16; ++i) b[i] = static_cast<uint8_t>(r[end - 16 + i]);
      addr = asio::ip::address_v6(b);
    } else {
      __builtin_trap();
    }
    if (!addr.is_loopback()) {
      const auto name = dns.nameFor(addr);
      if (!name || vdns::normalizeName(*name) != *name) __builtin_trap();
    }
  }
  if (dns.liveNames() > 64) __builtin_trap();
  return 0;
}
