// Fuzzes the tunnel request head parser and what the classifier does with its result: split
// the input at a byte chosen by the input, feed both parts, and, if a head completes, run
// the authority through the name rules. Nothing may crash, assert or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "policy/name.h"
#include "proto/request_rewriter.h"
#include "proto/tunnel_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t split = size == 0 ? 0 : data[0] % (size + 1);
  proto::TunnelRequestParser parser;
  auto status = parser.feed(in.substr(0, split));
  if (status == proto::TunnelRequestParser::Status::kNeedMore)
    status = parser.feed(in.substr(split));
  if (status == proto::TunnelRequestParser::Status::kComplete) {
    std::string reason;
    if (const auto a = policy::parseAuthority(parser.request().authority, &reason)) {
      if (!policy::isIpLiteral(a->host)) (void)policy::normalizeName(a->host, &reason);
    }
  }
  // The same bytes as a mesh request stream: the rewritten output must never carry the
  // sandbox's own identity header.
  proto::RequestStreamRewriter rewriter("X-Sam-Agent", "fuzz.agent");
  std::string out;
  rewriter.feed(in.substr(0, split), &out);
  rewriter.feed(in.substr(split), &out);
  return 0;
}
