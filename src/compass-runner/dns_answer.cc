#include "compass-runner/dns_answer.h"

#include <arpa/nameser.h>
#include <resolv.h>

#include <algorithm>
#include <array>
#include <stdexcept>

#include "common/wire_bytes.h"
#include "policy/address.h"
#include "policy/name.h"

// DNS wire format through glibc's resolver library (resolv(3): ns_initparse, ns_parserr,
// ns_name_unpack, dn_comp), part of libc6 itself. The runner used ldns before; Debian's static
// libldns drags in libcrypto, whose 350 KB of relocated tables cost every agent start about
// 2 ms of page faults (bench/runner_bench.py), for DNSSEC code the runner never calls.

namespace runner::firewall {
namespace {

constexpr size_t kHeaderBytes = 12;
constexpr uint16_t kTypeA = 1;
constexpr uint16_t kTypeAaaa = 28;
constexpr uint16_t kTypeOpt = 41;
constexpr uint16_t kClassIn = 1;
constexpr uint8_t kOpcodeQuery = 0;
constexpr uint8_t kRcodeNoError = 0;
constexpr uint8_t kRcodeFormErr = 1;
constexpr uint8_t kRcodeServFail = 2;
constexpr uint8_t kRcodeNxDomain = 3;
constexpr uint8_t kRcodeNotImp = 4;
constexpr uint8_t kRcodeRefused = 5;

using common::get16;
using common::put16;
using common::put32;

const unsigned char* bytes(std::string_view b) {
  return reinterpret_cast<const unsigned char*>(b.data());
}

// A reply that needs no parsed question: the ID and RD echoed, counts zero (FORMERR, NOTIMP).
std::string headerOnly(std::string_view query, uint8_t rcode) {
  std::string r(kHeaderBytes, '\0');
  r[0] = query[0];
  r[1] = query[1];
  const uint8_t flags1 = query.size() > 2 ? static_cast<uint8_t>(query[2]) : 0;
  // QR, the query's opcode and RD; RA set.
  r[2] = static_cast<char>(0x80 | (flags1 & 0x79));
  r[3] = static_cast<char>(0x80 | (rcode & 0x0f));
  return r;
}

// The one question of a query: its name uncompressed on the wire (letter case as sent), type
// and class.
struct Question {
  std::string wire_name;
  uint16_t qtype = 0;
  uint16_t qclass = 0;
};

// The reply to a parsed query: the question echoed as sent (some stubs compare its case), then
// one answer per address, each owned by a pointer to the question's name (RFC 1035 §4.1.4).
std::string buildReply(std::string_view query, const Question& q, uint8_t rcode,
                       const std::vector<asio::ip::address>& addresses, bool truncated) {
  std::string r;
  r.reserve(kHeaderBytes + q.wire_name.size() + 4 + addresses.size() * 28);
  r += query.substr(0, 2);  // ID
  const uint8_t rd = static_cast<uint8_t>(query[2]) & 0x01;
  r += static_cast<char>(0x80 | (kOpcodeQuery << 3) | (truncated ? 0x02 : 0) | rd);
  r += static_cast<char>(0x80 | (rcode & 0x0f));  // RA
  put16(&r, 1);
  put16(&r, static_cast<uint16_t>(addresses.size()));
  put16(&r, 0);
  put16(&r, 0);
  r += q.wire_name;
  put16(&r, q.qtype);
  put16(&r, q.qclass);
  for (const auto& a : addresses) {
    put16(&r, 0xc000 | kHeaderBytes);  // the question's name
    put16(&r, a.is_v4() ? kTypeA : kTypeAaaa);
    put16(&r, kClassIn);
    put32(&r, kAnswerTtlSeconds);
    const auto rdata = [&r](const auto& b) {
      put16(&r, static_cast<uint16_t>(b.size()));
      r.append(reinterpret_cast<const char*>(b.data()), b.size());
    };
    if (a.is_v4()) {
      rdata(a.to_v4().to_bytes());
    } else {
      rdata(a.to_v6().to_bytes());
    }
  }
  return r;
}

// Parses what follows the header: exactly one question, then at most one additional record,
// which must be an OPT (EDNS0, RFC 6891) owned by the root; nothing after. glibc checks every
// name (labels ≤ 63 bytes, names ≤ 255, compression pointers inside the message, no loops).
std::optional<Question> parseQuestion(std::string_view query) {
  ns_msg msg{};
  if (ns_initparse(bytes(query), static_cast<int>(query.size()), &msg) != 0) return std::nullopt;
  Question q;
  std::array<unsigned char, NS_MAXCDNAME> name{};
  const unsigned char* eom = bytes(query) + query.size();
  const int used =
      ns_name_unpack(bytes(query), eom, bytes(query) + kHeaderBytes, name.data(), name.size());
  if (used < 0 || kHeaderBytes + static_cast<size_t>(used) + 4 > query.size()) return std::nullopt;
  size_t wire = 0;
  while (wire < name.size() && name[wire] != 0) wire += name[wire] + 1U;
  if (wire >= name.size()) return std::nullopt;
  // Nothing precedes the question but the header, so a compressed question name could only
  // point into the header: malformed (the reply would echo a name the client never spelled).
  if (static_cast<size_t>(used) != wire + 1) return std::nullopt;
  q.wire_name.assign(reinterpret_cast<const char*>(name.data()), wire + 1);
  q.qtype = get16(query, kHeaderBytes + static_cast<size_t>(used));
  q.qclass = get16(query, kHeaderBytes + static_cast<size_t>(used) + 2);
  if (ns_msg_count(msg, ns_s_ar) == 1) {
    ns_rr opt{};
    if (ns_parserr(&msg, ns_s_ar, 0, &opt) != 0 || ns_rr_type(opt) != kTypeOpt) {
      return std::nullopt;
    }
    const std::string_view owner = ns_rr_name(opt);
    if (!owner.empty() && owner != ".") return std::nullopt;
  }
  return q;
}

// The question's name from its uncompressed wire form, label by label, so that a '.' or a
// non-ASCII byte inside a label can never pass for a separator: every byte must be a letter,
// digit or '-'. Returns "" for the root or any other byte.
std::string qnameText(std::string_view wire_name) {
  std::string out;
  size_t i = 0;
  while (i < wire_name.size() && wire_name[i] != 0) {
    const size_t len = static_cast<uint8_t>(wire_name[i]);
    if (len > policy::kMaxLabelBytes || i + 1 + len > wire_name.size()) return {};
    if (!out.empty()) out += '.';
    for (size_t k = i + 1; k <= i + len; ++k) {
      const char c = wire_name[k];
      const bool ok =
          (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
      if (!ok) return {};
      out += c;
    }
    i += 1 + len;
  }
  return out;
}

bool wantFamily(const asio::ip::address& a, uint16_t qtype) {
  return qtype == kTypeA ? a.is_v4() : a.is_v6();
}

}  // namespace

Answer answerQuery(std::string_view query, const AnswerContext& ctx) {
  if (ctx.allow == nullptr || !ctx.resolve || !ctx.admit) {
    throw std::invalid_argument("answerQuery: allowlist, resolve and admit are required");
  }
  Answer out;
  const auto refuse = [&out](uint8_t rcode, std::string reason, std::string reply) {
    out.rcode = rcode;
    out.reason = std::move(reason);
    out.reply = std::move(reply);
    return out;
  };
  // Never answer an answer: two forwarders (or a spoofed source) must not ping-pong.
  if (query.size() < 2 || (query.size() > 2 && (static_cast<uint8_t>(query[2]) & 0x80) != 0)) {
    out.reason = "not-a-query";
    return out;
  }
  if (query.size() < kHeaderBytes) {
    return refuse(kRcodeFormErr, "malformed", headerOnly(query, kRcodeFormErr));
  }
  const uint8_t opcode = (static_cast<uint8_t>(query[2]) >> 3) & 0x0f;
  if (opcode != kOpcodeQuery) {
    return refuse(kRcodeNotImp, "not-implemented", headerOnly(query, kRcodeNotImp));
  }
  // Strict: exactly what a stub resolver sends (one question, at most an OPT record).
  if (get16(query, 4) != 1 || get16(query, 6) != 0 || get16(query, 8) != 0 ||
      get16(query, 10) > 1) {
    return refuse(kRcodeFormErr, "malformed", headerOnly(query, kRcodeFormErr));
  }
  const std::optional<Question> question = parseQuestion(query);
  if (!question) return refuse(kRcodeFormErr, "malformed", headerOnly(query, kRcodeFormErr));
  out.qtype = question->qtype;
  const auto reply = [&](uint8_t rcode, const std::vector<asio::ip::address>& addresses) {
    std::string wire = buildReply(query, *question, rcode, addresses, false);
    if (wire.size() > ctx.max_reply) wire = buildReply(query, *question, rcode, {}, true);
    return wire;
  };
  if (question->qclass != kClassIn) {
    return refuse(kRcodeRefused, "class-not-in", reply(kRcodeRefused, {}));
  }
  const std::string raw_name = qnameText(question->wire_name);
  std::optional<std::string> name;
  if (!raw_name.empty() && !policy::isIpLiteral(raw_name)) name = policy::normalizeName(raw_name);
  if (!name) return refuse(kRcodeRefused, "invalid-name", reply(kRcodeRefused, {}));
  out.name = *name;

  // The allowlist before anything else: a denied name is never resolved, so neither the
  // host's resolver nor anything upstream of it learns what the sandbox asked.
  const auto ports = allowedPorts(*ctx.allow, out.name);
  if (!ports) return refuse(kRcodeRefused, "denied-name", reply(kRcodeRefused, {}));
  if (out.qtype != kTypeA && out.qtype != kTypeAaaa) {
    out.reply = reply(kRcodeNoError, {});
    return out;
  }

  const Resolution res = ctx.resolve(out.name);
  switch (res.status) {
    case Resolution::Status::kOk:
      break;
    case Resolution::Status::kNoName:
      out.rcode = kRcodeNxDomain;
      out.reply = reply(kRcodeNxDomain, {});
      return out;
    case Resolution::Status::kNoData:
      out.reply = reply(kRcodeNoError, {});
      return out;
    case Resolution::Status::kTimedOut:
      return refuse(kRcodeServFail, "resolve-timeout", reply(kRcodeServFail, {}));
    case Resolution::Status::kFailed:
      return refuse(kRcodeServFail, "resolve-failed", reply(kRcodeServFail, {}));
  }
  for (const auto& a : res.addresses) {
    // An AAAA of ::ffff:a.b.c.d would reach a.b.c.d over IPv4 from a dual-stack socket,
    // outside what this answer opens; such spellings are dropped, not translated.
    if (a.is_v6() && policy::canonicalAddress(a).is_v4()) {
      if (out.qtype == kTypeAaaa) out.filtered.push_back(a);
      continue;
    }
    if (!wantFamily(a, out.qtype)) continue;
    const auto plain = a.is_v6() ? asio::ip::address(asio::ip::address_v6(a.to_v6().to_bytes()))
                                 : a;  // scope ids mean nothing to the sandbox
    if (policy::isForbiddenAddress(plain) || inPools(plain) || (ctx.local && ctx.local(plain))) {
      out.filtered.push_back(plain);
      continue;
    }
    if (std::find(out.answered.begin(), out.answered.end(), plain) != out.answered.end()) continue;
    if (out.answered.size() < kMaxAnswerAddresses) out.answered.push_back(plain);
  }
  if (out.answered.empty()) {
    if (!out.filtered.empty()) out.reason = "forbidden-address";
    out.reply = reply(kRcodeNoError, {});
    return out;
  }
  // Open the addresses before the agent learns them, so its first SYN already passes.
  if (!ctx.admit(elementsFor(out.name, *ports, out.answered))) {
    out.answered.clear();
    return refuse(kRcodeServFail, "admit-failed", reply(kRcodeServFail, {}));
  }
  out.reply = reply(kRcodeNoError, out.answered);
  if (!out.filtered.empty()) out.reason = "forbidden-address";
  return out;
}

std::string buildQuery(uint16_t id, const std::string& name, uint16_t qtype) {
  std::array<unsigned char, NS_MAXCDNAME> wire{};
  const int n = dn_comp(name.c_str(), wire.data(), static_cast<int>(wire.size()), nullptr, nullptr);
  if (n <= 1) throw std::invalid_argument("not a DNS name: " + name);  // 1: the root alone
  std::string q;
  put16(&q, id);
  put16(&q, 0x0100);  // a query, RD set
  put16(&q, 1);
  put16(&q, 0);
  put16(&q, 0);
  put16(&q, 0);
  q.append(reinterpret_cast<const char*>(wire.data()), static_cast<size_t>(n));
  put16(&q, qtype);
  put16(&q, kClassIn);
  return q;
}

ParsedReply parseReply(std::string_view reply) {
  ns_msg msg{};
  if (ns_initparse(bytes(reply), static_cast<int>(reply.size()), &msg) != 0) {
    throw std::invalid_argument("malformed DNS reply");
  }
  ParsedReply out;
  out.id = ns_msg_id(msg);
  out.rcode = static_cast<uint8_t>(ns_msg_getflag(msg, ns_f_rcode));
  out.truncated = ns_msg_getflag(msg, ns_f_tc) != 0;
  for (int i = 0; i < ns_msg_count(msg, ns_s_an); ++i) {
    ns_rr rr{};
    if (ns_parserr(&msg, ns_s_an, i, &rr) != 0) throw std::invalid_argument("malformed DNS reply");
    if (ns_rr_type(rr) == kTypeA && ns_rr_rdlen(rr) == 4) {
      asio::ip::address_v4::bytes_type b{};
      std::copy_n(ns_rr_rdata(rr), 4, b.begin());
      out.addresses.emplace_back(asio::ip::address_v4(b));
    } else if (ns_rr_type(rr) == kTypeAaaa && ns_rr_rdlen(rr) == 16) {
      asio::ip::address_v6::bytes_type b{};
      std::copy_n(ns_rr_rdata(rr), 16, b.begin());
      out.addresses.emplace_back(asio::ip::address_v6(b));
    }
  }
  return out;
}

}  // namespace runner::firewall
