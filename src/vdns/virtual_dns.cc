// Virtual DNS: hand-written RFC 1035 wire format, because nano-init is one static binary and
// Debian ships no static libldns. Every rule, in the order the code applies it:
//
//  1. Fewer than 2 bytes, or QR=1 (a response, never ours to answer): dropped (empty result).
//  2. Fewer than 12 bytes (no full header): FORMERR echoing the ID.
//  3. OPCODE other than QUERY: NOTIMP.
//  4. QDCOUNT != 1, ANCOUNT != 0, NSCOUNT != 0, ARCOUNT > 1: FORMERR.
//  5. The question name: labels of ≤ 63 bytes, ≤ 255 wire bytes in all, compression pointers
//     only strictly backwards and at most kMaxPointerHops of them (so no loop can exist),
//     reserved label types (01/10) refused; any violation, or a truncated question: FORMERR.
//  6. The additional record, if any, must be one OPT (EDNS0, RFC 6891) with the root name;
//     anything else, or bytes after it: FORMERR. EDNS version > 0: BADVERS. A query with OPT
//     gets an OPT back (payload size kEdnsPayload, no options).
//  7. QCLASS other than IN (or ANY): NOERROR, no data.
//  8. A name that fails normalizeName() (not RFC 1123, non-ASCII, an address spelling):
//     NXDOMAIN for every type. NXDOMAIN rather than REFUSED so that a resolver stops at once
//     instead of trying the next server or search domain forever.
//  9. "localhost" and "*.localhost" (RFC 6761 §6.3): A 127.0.0.1 / AAAA ::1, not remembered.
// 10. A or AAAA: the name's synthetic address (allocated on first use), TTL kAnswerTtlSeconds,
//     AA set. No address left: SERVFAIL (counted).
// 11. Any other type for a valid name: NOERROR with no data (so TXT/MX/SRV learn nothing).
//
// The pool: each remembered name owns one slot; slot i maps to a fixed IPv4 address (skipping
// 100.64.0.0/24, where tun0 lives, 100.127.255.0/24, where the resolver lives, and every .0
// and .255) and a fixed IPv6 address 100::1:0:0 + i + 1. A name keeps its slot while it is
// remembered, so one address means one name at a time. A new name takes a never-used slot,
// else the least recently answered name with no live flow whose last answer is older than
// the answer hold is forgotten and its slot reused.

#include "vdns/virtual_dns.h"

#include <algorithm>
#include <array>
#include <list>
#include <unordered_map>
#include <vector>

#include "common/wire_bytes.h"

namespace vdns {
namespace {

constexpr size_t kHeaderBytes = 12;
constexpr size_t kMaxWireName = 255;
constexpr int kMaxPointerHops = 16;
constexpr uint16_t kEdnsPayload = 1232;

constexpr uint16_t kTypeA = 1;
constexpr uint16_t kTypeAaaa = 28;
constexpr uint16_t kTypeOpt = 41;
constexpr uint16_t kClassIn = 1;
constexpr uint16_t kClassAny = 255;

constexpr uint8_t kRcodeNoError = 0;
constexpr uint8_t kRcodeFormErr = 1;
constexpr uint8_t kRcodeServFail = 2;
constexpr uint8_t kRcodeNxDomain = 3;
constexpr uint8_t kRcodeNotImp = 4;
constexpr uint16_t kRcodeBadVers = 16;  // extended: upper 8 bits live in the OPT TTL

// IPv4 pool: blocks of 254 hosts from 100.64.1.0/24 up to 100.127.254.0/24.
constexpr uint32_t kV4First = 0x64400100;  // 100.64.1.0
constexpr uint32_t kV4Last = 0x647FFE00;   // 100.127.254.0
constexpr uint32_t kV4Slots = ((kV4Last - kV4First) / 256 + 1) * 254;

using common::get16;
using common::put16;
using common::put32;

struct Question {
  std::vector<std::string_view> labels;  // as sent (case preserved for the echo)
  uint16_t qtype = 0;
  uint16_t qclass = 0;
};

// Reads the question name starting at `*pos`; on success `*pos` is just past the name as it
// appears in place (a pointer ends it).
bool readName(std::string_view msg, size_t* pos, std::vector<std::string_view>* labels) {
  size_t at = *pos;
  size_t end_in_place = 0;
  size_t wire = 0;
  int hops = 0;
  size_t lowest = at;  // a pointer must go strictly below everything read so far
  while (true) {
    if (at >= msg.size()) return false;
    const auto len = static_cast<uint8_t>(msg[at]);
    if ((len & 0xC0) == 0xC0) {
      if (at + 1 >= msg.size() || ++hops > kMaxPointerHops) return false;
      const size_t target = ((len & 0x3F) << 8) | static_cast<uint8_t>(msg[at + 1]);
      if (end_in_place == 0) end_in_place = at + 2;
      if (target >= lowest || target < kHeaderBytes) return false;
      lowest = target;
      at = target;
      continue;
    }
    if ((len & 0xC0) != 0) return false;  // 01/10: reserved / obsolete label types
    wire += len + 1U;
    if (wire > kMaxWireName) return false;
    if (len == 0) {
      *pos = end_in_place != 0 ? end_in_place : at + 1;
      return true;
    }
    if (at + 1 + len > msg.size()) return false;
    labels->push_back(msg.substr(at + 1, len));
    at += 1U + len;
  }
}

std::string header(uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ar) {
  std::string out;
  out.reserve(512);
  put16(&out, id);
  put16(&out, flags);
  put16(&out, qd);
  put16(&out, an);
  put16(&out, 0);
  put16(&out, ar);
  return out;
}

// QR=1, opcode and RD echoed, AA=1, RA=1 (we "recurse": every name has an answer here).
uint16_t responseFlags(uint16_t query_flags, uint8_t rcode) {
  return static_cast<uint16_t>(0x8000 | (query_flags & 0x7800) | 0x0400 | (query_flags & 0x0100) |
                               0x0080 | (rcode & 0x0F));
}

bool isDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

std::optional<std::string> normalizeName(std::string_view raw) {
  if (!raw.empty() && raw.back() == '.') raw.remove_suffix(1);
  if (raw.empty() || raw.size() > 253) return std::nullopt;
  std::string out;
  out.reserve(raw.size());
  size_t label_start = 0;
  for (size_t i = 0; i <= raw.size(); ++i) {
    if (i == raw.size() || raw[i] == '.') {
      const size_t len = i - label_start;
      if (len == 0 || len > 63) return std::nullopt;
      if (out[label_start] == '-' || out.back() == '-') return std::nullopt;
      if (i < raw.size()) out.push_back('.');
      label_start = i + 1;
      continue;
    }
    char c = raw[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok) return std::nullopt;
    out.push_back(c);
  }
  const size_t last_dot = out.rfind('.');
  if (isDigits(last_dot == std::string::npos ? out : std::string_view(out).substr(last_dot + 1))) {
    return std::nullopt;
  }
  return out;
}

struct VirtualDns::Impl {
  struct Slot {
    std::string name;  // empty: unused
    bool v4 = false;   // A answered: the IPv4 address is live
    bool v6 = false;
    uint32_t flows = 0;
    std::chrono::steady_clock::time_point last_answer;
    std::list<uint32_t>::iterator lru;
  };

  size_t pool_size;
  std::chrono::milliseconds hold;
  std::vector<Slot> slots;  // grows to pool_size as fresh slots are taken
  std::unordered_map<std::string, uint32_t> by_name;
  std::list<uint32_t> lru;  // front: least recently answered
  Stats stats;

  std::optional<uint32_t> slotFor(const std::string& name,
                                  std::chrono::steady_clock::time_point now) {
    if (auto it = by_name.find(name); it != by_name.end()) return it->second;
    std::optional<uint32_t> slot;
    if (slots.size() < pool_size) {
      slot = static_cast<uint32_t>(slots.size());
      slots.emplace_back();
    } else {
      slot = evictOne(now);
      if (!slot) return std::nullopt;
    }
    Slot& s = slots[*slot];
    s.name = name;
    s.lru = lru.insert(lru.end(), *slot);
    by_name.emplace(name, *slot);
    return slot;
  }

  std::optional<uint32_t> evictOne(std::chrono::steady_clock::time_point now) {
    for (uint32_t idx : lru) {
      Slot& s = slots[idx];
      if (s.flows > 0) continue;
      // Ordered by last answer: once one is too recent, every later one is too.
      if (now - s.last_answer < hold) return std::nullopt;
      by_name.erase(s.name);
      lru.erase(s.lru);
      s = Slot{};
      ++stats.evicted;
      return idx;
    }
    return std::nullopt;
  }

  void touch(uint32_t idx, std::chrono::steady_clock::time_point now) {
    Slot& s = slots[idx];
    s.last_answer = now;
    lru.splice(lru.end(), lru, s.lru);
  }

  [[nodiscard]] const Slot* find(const asio::ip::address& addr, uint32_t* idx_out) const {
    std::optional<uint32_t> idx;
    bool v4 = false;
    if (addr.is_v4()) {
      const uint32_t a = addr.to_v4().to_uint();
      if (a < kV4First || a > kV4Last + 255) return nullptr;
      const uint32_t off = a - kV4First;
      const uint32_t host = off % 256;
      if (host == 0 || host == 255) return nullptr;
      idx = (off / 256) * 254 + host - 1;
      v4 = true;
    } else {
      const auto b = addr.to_v6().to_bytes();
      static constexpr std::array<uint8_t, 12> kPrefix = {0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
      for (size_t i = 0; i < kPrefix.size(); ++i) {
        if (b[i] != kPrefix[i]) return nullptr;
      }
      const uint32_t low = (uint32_t{b[12]} << 24) | (uint32_t{b[13]} << 16) |
                           (uint32_t{b[14]} << 8) | uint32_t{b[15]};
      if (low == 0) return nullptr;
      idx = low - 1;
    }
    if (*idx >= slots.size()) return nullptr;
    const Slot& s = slots[*idx];
    if (s.name.empty() || (v4 ? !s.v4 : !s.v6)) return nullptr;
    if (idx_out != nullptr) *idx_out = *idx;
    return &s;
  }
};

namespace {

void appendV4(std::string* out, uint32_t slot) {
  put32(out, kV4First + (slot / 254) * 256 + slot % 254 + 1);
}
void appendV6(std::string* out, uint32_t slot) {
  static constexpr std::array<uint8_t, 12> kPrefix = {0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  for (uint8_t b : kPrefix) out->push_back(static_cast<char>(b));
  put32(out, slot + 1);
}

}  // namespace

VirtualDns::VirtualDns(size_t pool_size, std::chrono::milliseconds answer_hold)
    : impl_(new Impl{}) {
  impl_->pool_size = std::max<size_t>(1, std::min<size_t>(pool_size, kV4Slots));
  impl_->hold = answer_hold;
}

VirtualDns::~VirtualDns() { delete impl_; }

size_t VirtualDns::liveNames() const { return impl_->by_name.size(); }
const Stats& VirtualDns::stats() const { return impl_->stats; }

std::string VirtualDns::answer(std::string_view q, std::chrono::steady_clock::time_point now) {
  Stats& st = impl_->stats;
  if (q.size() < 2 || (q.size() >= 3 && (static_cast<uint8_t>(q[2]) & 0x80) != 0)) {
    ++st.dropped;
    return {};
  }
  ++st.queries;
  const uint16_t id = get16(q, 0);
  if (q.size() < kHeaderBytes) {
    ++st.formerr;
    return header(id, responseFlags(0, kRcodeFormErr), 0, 0, 0);
  }
  const uint16_t flags = get16(q, 2);
  if (((flags >> 11) & 0x0F) != 0) return header(id, responseFlags(flags, kRcodeNotImp), 0, 0, 0);
  const auto formErr = [&] {
    ++st.formerr;
    return header(id, responseFlags(flags, kRcodeFormErr), 0, 0, 0);
  };
  if (get16(q, 4) != 1 || get16(q, 6) != 0 || get16(q, 8) != 0 || get16(q, 10) > 1) {
    return formErr();
  }
  size_t pos = kHeaderBytes;
  Question question;
  if (!readName(q, &pos, &question.labels) || pos + 4 > q.size()) return formErr();
  question.qtype = get16(q, pos);
  question.qclass = get16(q, pos + 2);
  pos += 4;

  bool edns = false;
  if (get16(q, 10) == 1) {
    // OPT: root name (one zero byte), type, class (payload size), TTL, RDLENGTH, RDATA.
    if (pos + 11 > q.size() || q[pos] != 0 || get16(q, pos + 1) != kTypeOpt) return formErr();
    const auto version = static_cast<uint8_t>(q[pos + 6]);
    const uint16_t rdlen = get16(q, pos + 9);
    pos += 11;
    if (pos + rdlen != q.size()) return formErr();
    pos += rdlen;
    edns = true;
    if (version != 0) {
      std::string out = header(id, responseFlags(flags, kRcodeBadVers & 0x0F), 0, 0, 1);
      out.push_back(0);
      put16(&out, kTypeOpt);
      put16(&out, kEdnsPayload);
      put32(&out, static_cast<uint32_t>(kRcodeBadVers >> 4) << 24);
      put16(&out, 0);
      return out;
    }
  }
  if (pos != q.size()) return formErr();

  // Build the answer: the question echoed (decompressed, original case), then data, then OPT.
  uint8_t rcode = kRcodeNoError;
  std::string rdata;
  uint16_t rtype = 0;
  std::string text;
  for (size_t i = 0; i < question.labels.size(); ++i) {
    if (i > 0) text.push_back('.');
    // A dot inside a label would read as a separator; make such a name fail validation.
    if (question.labels[i].find('.') != std::string_view::npos) text.push_back('\x01');
    text.append(question.labels[i]);
  }
  const auto name = normalizeName(text);
  const bool address_query = question.qtype == kTypeA || question.qtype == kTypeAaaa;
  if (question.qclass != kClassIn && question.qclass != kClassAny) {
    ++st.empty;
  } else if (!name) {
    rcode = kRcodeNxDomain;
    ++st.nxdomain;
  } else if (!address_query) {
    ++st.empty;
  } else if (*name == "localhost" || name->ends_with(".localhost")) {
    rtype = question.qtype;
    if (rtype == kTypeA) {
      put32(&rdata, 0x7F000001);
    } else {
      rdata.assign(15, '\0');
      rdata.push_back('\x01');
    }
    ++st.synthesized;
  } else if (auto slot = impl_->slotFor(*name, now)) {
    auto& s = impl_->slots[*slot];
    impl_->touch(*slot, now);
    rtype = question.qtype;
    if (rtype == kTypeA) {
      s.v4 = true;
      appendV4(&rdata, *slot);
    } else {
      s.v6 = true;
      appendV6(&rdata, *slot);
    }
    ++st.synthesized;
  } else {
    rcode = kRcodeServFail;
    ++st.pool_exhausted;
  }

  std::string out = header(id, responseFlags(flags, rcode), 1, rdata.empty() ? 0 : 1, edns ? 1 : 0);
  for (std::string_view label : question.labels) {
    out.push_back(static_cast<char>(label.size()));
    out.append(label);
  }
  out.push_back(0);
  put16(&out, question.qtype);
  put16(&out, question.qclass);
  if (!rdata.empty()) {
    put16(&out, 0xC000 | kHeaderBytes);  // the question's name
    put16(&out, rtype);
    put16(&out, kClassIn);
    put32(&out, kAnswerTtlSeconds);
    put16(&out, static_cast<uint16_t>(rdata.size()));
    out.append(rdata);
  }
  if (edns) {
    out.push_back(0);
    put16(&out, kTypeOpt);
    put16(&out, kEdnsPayload);
    put32(&out, 0);
    put16(&out, 0);
  }
  return out;
}

std::optional<std::string> VirtualDns::nameFor(const asio::ip::address& addr) const {
  const auto* slot = impl_->find(addr, nullptr);
  if (slot == nullptr) return std::nullopt;
  return slot->name;
}

void VirtualDns::flowOpened(const asio::ip::address& addr) {
  uint32_t idx = 0;
  if (impl_->find(addr, &idx) != nullptr) ++impl_->slots[idx].flows;
}

void VirtualDns::flowClosed(const asio::ip::address& addr) {
  uint32_t idx = 0;
  if (impl_->find(addr, &idx) != nullptr && impl_->slots[idx].flows > 0) {
    --impl_->slots[idx].flows;
  }
}

}  // namespace vdns
