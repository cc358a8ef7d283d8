#include "proto/request_rewriter.h"

#include <gtest/gtest.h>

namespace proto {
namespace {

using Status = RequestStreamRewriter::Status;

std::string rewriteAll(std::string_view in, size_t chunk, Status* status = nullptr) {
  RequestStreamRewriter r("X-Sam-Agent", "researcher-1.prod.acme.example");
  std::string out;
  Status s = Status::kOk;
  for (size_t i = 0; i < in.size() && s == Status::kOk; i += chunk) {
    s = r.feed(in.substr(i, chunk), &out);
  }
  if (status != nullptr) *status = s;
  return out;
}

size_t count(std::string_view hay, std::string_view needle) {
  size_t n = 0;
  for (size_t pos = hay.find(needle); pos != std::string_view::npos;
       pos = hay.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

TEST(RequestRewriterTest, SpoofedHeadersInAnyCaseAreReplaced) {
  const std::string in =
      "GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Sam-Agent: admin.prod\r\n"
      "x-sam-agent: root\r\nX-SAM-AGENT: other\r\n\r\n";
  for (size_t chunk : {1, 3, 7, 1000}) {
    const std::string out = rewriteAll(in, chunk);
    EXPECT_EQ(count(out, "admin.prod"), 0u) << chunk;
    EXPECT_EQ(count(out, "root"), 0u);
    EXPECT_EQ(count(out, "other"), 0u);
    EXPECT_EQ(count(out, "X-Sam-Agent: researcher-1.prod.acme.example\r\n"), 1u);
    EXPECT_EQ(out.rfind("GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\n", 0), 0u);
  }
}

TEST(RequestRewriterTest, PipelinedRequestsAreEachRewrittenAndBodiesKept) {
  const std::string body = "{\"model\":\"m\",\"x\":\"X-Sam-Agent: inside-body\"}";
  const std::string in =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: mesh.sam.alt\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body +
      "GET /mcp HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Sam-Agent: spoof\r\n\r\n";
  for (size_t chunk : {1, 5, 64, 4096}) {
    const std::string out = rewriteAll(in, chunk);
    EXPECT_EQ(count(out, "X-Sam-Agent: researcher-1.prod.acme.example\r\n"), 2u) << chunk;
    EXPECT_EQ(count(out, "spoof"), 0u);
    EXPECT_NE(out.find(body), std::string::npos);  // body bytes untouched, even header-like ones
  }
}

TEST(RequestRewriterTest, ChunkedBodyPassesThroughAndNextHeadIsRewritten) {
  const std::string in =
      "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n0\r\n\r\n"
      "GET /b HTTP/1.1\r\nHost: h\r\nx-sam-agent: spoof\r\n\r\n";
  const std::string out = rewriteAll(in, 2);
  EXPECT_NE(out.find("5\r\nhello\r\n0\r\n\r\n"), std::string::npos);
  EXPECT_EQ(count(out, "spoof"), 0u);
  EXPECT_EQ(count(out, "X-Sam-Agent: researcher-1"), 2u);
}

TEST(RequestRewriterTest, SmugglingWithBothLengthsIsMalformed) {
  Status s = Status::kOk;
  rewriteAll(
      "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
      "0\r\n\r\nGET /admin HTTP/1.1\r\nX-Sam-Agent: spoof\r\n\r\n",
      4096, &s);
  EXPECT_EQ(s, Status::kMalformed);
}

TEST(RequestRewriterTest, UpgradeAndConnectAreRefusedNotPassedThrough) {
  for (const char* in :
       {"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        "GET / HTTP/1.1\r\nX-Sam-Agent: smuggled\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\n\r\n",
        "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example\r\n\r\n"}) {
    Status s = Status::kOk;
    const std::string out = rewriteAll(in, 3, &s);
    EXPECT_EQ(s, Status::kMalformed) << in;
    EXPECT_EQ(count(out, "smuggled"), 0u);
    EXPECT_EQ(out, "") << in;  // nothing of the refused request is forwarded
  }
}

TEST(RequestRewriterTest, NonTokenFieldNamesAreRefused) {
  // "X-Pad : x" is accepted by llhttp but ends the header section for stricter parsers,
  // which would then read the body as a second request with its own X-Sam-Agent.
  for (const char* in :
       {"POST / HTTP/1.1\r\nHost: h\r\nX-Pad : x\r\nContent-Length: 0\r\n\r\n",
        "GET / HTTP/1.1\r\nX-Sam-Agent : evil\r\n\r\n", "GET / HTTP/1.1\r\n: empty-name\r\n\r\n"}) {
    Status s = Status::kOk;
    const std::string out = rewriteAll(in, 4096, &s);
    EXPECT_EQ(s, Status::kMalformed) << in;
    EXPECT_EQ(out, "") << in;
  }
}

TEST(RequestRewriterTest, UnderscoreSpellingIsStrippedToo) {
  const std::string out =
      rewriteAll("GET / HTTP/1.1\r\nHost: h\r\nX_Sam_Agent: ceo\r\nx_sam-AGENT: ceo2\r\n\r\n", 5);
  EXPECT_EQ(count(out, "ceo"), 0u);
  EXPECT_EQ(count(out, "X-Sam-Agent: researcher-1.prod.acme.example\r\n"), 1u);
}

TEST(RequestRewriterTest, TrailersAreRefusedAndBounded) {
  Status s = Status::kOk;
  std::string out = rewriteAll(
      "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
      "X-Sam-Agent: ceo\r\n\r\n",
      4096, &s);
  EXPECT_EQ(s, Status::kMalformed);
  EXPECT_EQ(count(out, "ceo"), 0u);
  // An endless trailer is refused at its first byte, not buffered.
  RequestStreamRewriter r("X-Sam-Agent", "a");
  out.clear();
  EXPECT_EQ(
      r.feed("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Big: ", &out),
      Status::kMalformed);
  EXPECT_EQ(r.feed(std::string(1 << 20, 'a'), &out), Status::kMalformed);
}

TEST(RequestRewriterTest, OddRequestLinesAreRefused) {
  for (const char* in :
       {"GET / HTTP/2.0\r\nHost: h\r\n\r\n", "GET http://evil/ HTTP/1.1\r\n\r\n",
        "GET /\xff HTTP/1.1\r\nHost: h\r\n\r\n", "GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n"}) {
    Status s = Status::kOk;
    const std::string out = rewriteAll(in, 4096, &s);
    EXPECT_EQ(s, Status::kMalformed) << in;
    EXPECT_EQ(out, "") << in;
  }
}

TEST(RequestRewriterTest, Http10KeepsItsVersion) {
  const std::string out = rewriteAll("GET /a HTTP/1.0\r\nHost: h\r\n\r\n", 4096);
  EXPECT_EQ(out.rfind("GET /a HTTP/1.0\r\n", 0), 0u);
}

TEST(RequestRewriterTest, EmptyValueStripsOnly) {
  RequestStreamRewriter r("X-Sam-Agent", "");
  std::string out;
  ASSERT_EQ(r.feed("GET / HTTP/1.1\r\nHost: h\r\nX-Sam-Agent: spoof\r\n\r\n", &out), Status::kOk);
  EXPECT_EQ(out, "GET / HTTP/1.1\r\nHost: h\r\n\r\n");
}

TEST(RequestRewriterTest, GarbageAndOversizedHeads) {
  Status s = Status::kOk;
  rewriteAll("\x16\x03\x01 not http", 4096, &s);
  EXPECT_EQ(s, Status::kMalformed);
  rewriteAll("GET / HTTP/1.1\r\nA: " + std::string(kMaxRequestHeadBytes, 'a') + "\r\n\r\n", 512,
             &s);
  EXPECT_EQ(s, Status::kTooLarge);
}

}  // namespace
}  // namespace proto
