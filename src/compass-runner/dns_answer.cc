#include "compass-runner/dns_answer.h"

#include <ldns/ldns.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "policy/address.h"
#include "policy/name.h"

namespace runner::firewall {
namespace {

constexpr size_t kHeaderBytes = 12;
constexpr uint16_t kTypeA = 1;
constexpr uint16_t kTypeAaaa = 28;
constexpr uint8_t kRcodeNoError = 0;
constexpr uint8_t kRcodeFormErr = 1;
constexpr uint8_t kRcodeServFail = 2;
constexpr uint8_t kRcodeNxDomain = 3;
constexpr uint8_t kRcodeNotImp = 4;
constexpr uint8_t kRcodeRefused = 5;

struct PktFree {
  void operator()(ldns_pkt* p) const { ldns_pkt_free(p); }
};
using PktPtr = std::unique_ptr<ldns_pkt, PktFree>;

uint16_t get16(std::string_view b, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(b[at]) << 8) |
                               static_cast<uint8_t>(b[at + 1]));
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

std::string toWire(const ldns_pkt* pkt) {
  uint8_t* wire = nullptr;
  size_t size = 0;
  if (ldns_pkt2wire(&wire, pkt, &size) != LDNS_STATUS_OK || wire == nullptr) {
    std::free(wire);
    return {};
  }
  std::string out(reinterpret_cast<const char*>(wire), size);
  std::free(wire);  // ldns allocates with malloc (LDNS_XMALLOC)
  return out;
}

// The reply to a parsed query: question echoed as sent (some stubs compare its case), answers
// for `addresses` under the question's owner.
std::string buildReply(const ldns_pkt* query, const ldns_rr* question, uint8_t rcode,
                       const std::vector<asio::ip::address>& addresses, bool truncated) {
  PktPtr r(ldns_pkt_new());
  if (!r) return {};
  ldns_pkt_set_id(r.get(), ldns_pkt_id(query));
  ldns_pkt_set_qr(r.get(), true);
  ldns_pkt_set_opcode(r.get(), LDNS_PACKET_QUERY);
  ldns_pkt_set_rd(r.get(), ldns_pkt_rd(query));
  ldns_pkt_set_ra(r.get(), true);
  ldns_pkt_set_tc(r.get(), truncated);
  ldns_pkt_set_rcode(r.get(), rcode);
  ldns_pkt_push_rr(r.get(), LDNS_SECTION_QUESTION, ldns_rr_clone(question));
  for (const auto& a : addresses) {
    ldns_rr* rr = ldns_rr_new();
    ldns_rr_set_owner(rr, ldns_rdf_clone(ldns_rr_owner(question)));
    ldns_rr_set_class(rr, LDNS_RR_CLASS_IN);
    ldns_rr_set_ttl(rr, kAnswerTtlSeconds);
    if (a.is_v4()) {
      const auto b = a.to_v4().to_bytes();
      ldns_rr_set_type(rr, LDNS_RR_TYPE_A);
      ldns_rr_push_rdf(rr, ldns_rdf_new_frm_data(LDNS_RDF_TYPE_A, b.size(), b.data()));
    } else {
      const auto b = a.to_v6().to_bytes();
      ldns_rr_set_type(rr, LDNS_RR_TYPE_AAAA);
      ldns_rr_push_rdf(rr, ldns_rdf_new_frm_data(LDNS_RDF_TYPE_AAAA, b.size(), b.data()));
    }
    ldns_pkt_push_rr(r.get(), LDNS_SECTION_ANSWER, rr);
  }
  return toWire(r.get());
}

// The question's name from its uncompressed wire form, label by label, so that a '.' or a
// non-ASCII byte inside a label can never pass for a separator: every byte must be a letter,
// digit or '-'. Returns "" for the root or any other byte.
std::string qnameText(const ldns_rdf* owner) {
  const auto* d = ldns_rdf_data(owner);
  const size_t size = ldns_rdf_size(owner);
  std::string out;
  size_t i = 0;
  while (i < size && d[i] != 0) {
    const size_t len = d[i];
    if (len > policy::kMaxLabelBytes || i + 1 + len > size) return {};
    if (!out.empty()) out += '.';
    for (size_t k = i + 1; k <= i + len; ++k) {
      const char c = static_cast<char>(d[k]);
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
  if (opcode != LDNS_PACKET_QUERY) {
    return refuse(kRcodeNotImp, "not-implemented", headerOnly(query, kRcodeNotImp));
  }
  // Strict: exactly what a stub resolver sends (one question, at most an OPT record).
  if (get16(query, 4) != 1 || get16(query, 6) != 0 || get16(query, 8) != 0 ||
      get16(query, 10) > 1) {
    return refuse(kRcodeFormErr, "malformed", headerOnly(query, kRcodeFormErr));
  }
  ldns_pkt* raw = nullptr;
  if (ldns_wire2pkt(&raw, reinterpret_cast<const uint8_t*>(query.data()), query.size()) !=
      LDNS_STATUS_OK) {
    if (raw != nullptr) ldns_pkt_free(raw);
    return refuse(kRcodeFormErr, "malformed", headerOnly(query, kRcodeFormErr));
  }
  const PktPtr pkt(raw);
  const ldns_rr_list* questions = ldns_pkt_question(pkt.get());
  if (questions == nullptr || ldns_rr_list_rr_count(questions) != 1 ||
      ldns_rr_list_rr_count(ldns_pkt_additional(pkt.get())) != 0 ||
      ldns_pkt_tsig(pkt.get()) != nullptr) {
    return refuse(kRcodeFormErr, "malformed", headerOnly(query, kRcodeFormErr));
  }
  const ldns_rr* question = ldns_rr_list_rr(questions, 0);
  out.qtype = static_cast<uint16_t>(ldns_rr_get_type(question));
  const auto reply = [&](uint8_t rcode, const std::vector<asio::ip::address>& addresses) {
    std::string wire = buildReply(pkt.get(), question, rcode, addresses, false);
    if (wire.size() > ctx.max_reply) wire = buildReply(pkt.get(), question, rcode, {}, true);
    return wire;
  };
  if (ldns_rr_get_class(question) != LDNS_RR_CLASS_IN) {
    return refuse(kRcodeRefused, "class-not-in", reply(kRcodeRefused, {}));
  }
  const std::string raw_name = qnameText(ldns_rr_owner(question));
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
  ldns_rdf* owner = ldns_dname_new_frm_str(name.c_str());
  if (owner == nullptr) throw std::invalid_argument("not a DNS name: " + name);
  PktPtr q(ldns_pkt_query_new(owner, static_cast<ldns_rr_type>(qtype), LDNS_RR_CLASS_IN, LDNS_RD));
  if (!q) throw std::invalid_argument("cannot build a query for " + name);
  ldns_pkt_set_id(q.get(), id);
  std::string wire = toWire(q.get());
  if (wire.empty()) throw std::invalid_argument("cannot encode a query for " + name);
  return wire;
}

ParsedReply parseReply(std::string_view reply) {
  ldns_pkt* raw = nullptr;
  if (ldns_wire2pkt(&raw, reinterpret_cast<const uint8_t*>(reply.data()), reply.size()) !=
      LDNS_STATUS_OK) {
    if (raw != nullptr) ldns_pkt_free(raw);
    throw std::invalid_argument("malformed DNS reply");
  }
  const PktPtr pkt(raw);
  ParsedReply out;
  out.id = ldns_pkt_id(pkt.get());
  out.rcode = static_cast<uint8_t>(ldns_pkt_get_rcode(pkt.get()));
  out.truncated = ldns_pkt_tc(pkt.get());
  const ldns_rr_list* answers = ldns_pkt_answer(pkt.get());
  for (size_t i = 0; answers != nullptr && i < ldns_rr_list_rr_count(answers); ++i) {
    const ldns_rr* rr = ldns_rr_list_rr(answers, i);
    const ldns_rdf* rd = ldns_rr_rdf(rr, 0);
    if (rd == nullptr) continue;
    if (ldns_rr_get_type(rr) == LDNS_RR_TYPE_A && ldns_rdf_size(rd) == 4) {
      asio::ip::address_v4::bytes_type b{};
      std::copy_n(ldns_rdf_data(rd), 4, b.begin());
      out.addresses.emplace_back(asio::ip::address_v4(b));
    } else if (ldns_rr_get_type(rr) == LDNS_RR_TYPE_AAAA && ldns_rdf_size(rd) == 16) {
      asio::ip::address_v6::bytes_type b{};
      std::copy_n(ldns_rdf_data(rd), 16, b.begin());
      out.addresses.emplace_back(asio::ip::address_v6(b));
    }
  }
  return out;
}

}  // namespace runner::firewall
