#include "sam-node/proxy.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace samnode {
namespace {

TEST(PathProblemTest, PathsThatStayUnderTheBaseAreAccepted) {
  for (const char* path :
       {"/v1/models", "/v1/chat/completions", "/v1", "/v1/", "/v1/models/", "/v1//chat",
        "/v1/files/file-abc%20x", "/a2a/bar/.well-known/agent-card.json", "x/y", "", "/v1/...",
        "/v1/..x", "/v1/x..", "/v1/.hidden", "/v1/%41%42", "/v1/a;b"})
    EXPECT_EQ(pathProblem(path), "") << path;
}

TEST(PathProblemTest, DotSegmentsInAnySpellingAreRefused) {
  for (const char* path :
       {"/v1/../admin", "/v1/x/../../admin", "/v1/./../admin", "/v1/.", "/v1/..", "..",
        "../hidden/x", "/v1/%2e%2e/admin", "/v1/.%2E/admin", "/v1/%2E./admin", "/v1/%2e/x",
        "/v1/%252e%252e/admin", "/v1/..;/admin", "/v1/%2e%2e;x/admin", "/v1/..%20/admin",
        "/v1/%20.%09/x", "/v1/%2e%2e%0d%0a/admin", "/v1/%09..;x/admin"})
    EXPECT_EQ(pathProblem(path), "a dot segment") << path;
}

TEST(PathProblemTest, EncodedSeparatorsAndBackslashesAreRefused) {
  for (const char* path : {"/v1/..%2fadmin", "/v1/..%2Fadmin", "/v1/a%5cb", "/v1/a%5C..",
                           "/v1/a%00b", "/v1/%252f", "/a2a/bar/..%2Fhidden/x"})
    EXPECT_EQ(pathProblem(path), "an encoded '/', '\\' or NUL") << path;
  EXPECT_EQ(pathProblem("/v1/..\\admin"), "a backslash");
  EXPECT_EQ(pathProblem("/v1/a\\b"), "a backslash");
}

TEST(PathProblemTest, MalformedOrDeeplyNestedEscapesAreRefused) {
  for (const char* path : {"/v1/%", "/v1/%2", "/v1/%zz", "/v1/a%g1"})
    EXPECT_EQ(pathProblem(path), "a '%' not followed by two hex digits") << path;
  EXPECT_NE(pathProblem("/v1/%25252525252e"), "");
  // A long run of nested escapes is refused after a few rounds, not decoded round by round.
  std::string deep = "/v1/%";
  for (int i = 0; i < 20000; ++i) deep += "25";
  deep += "2e";
  EXPECT_NE(pathProblem(deep), "");
}

TEST(ForwardableHeadersTest, BoundaryCredentialAndHopByHopFieldsStayBehind) {
  const Headers in = {{"Content-Type", "application/json"},
                      {"X-Sam-Caller", "forged"},
                      {"X_Sam_Caller", "forged"},
                      {"x_sam_agent", "forged"},
                      {"X-SAM_Anything", "forged"},
                      {"Authorization", "Bearer agent"},
                      {"Proxy_Authorization", "Basic eA=="},
                      {"Host", "evil.example"},
                      {"Transfer_Encoding", "chunked"},
                      {"Connection", "close"},
                      {"X-Samuel", "kept"},
                      {"Accept", "text/event-stream"}};
  const Headers out = forwardableHeaders(in);
  const Headers want = {
      {"Content-Type", "application/json"}, {"X-Samuel", "kept"}, {"Accept", "text/event-stream"}};
  EXPECT_EQ(out, want);
}

}  // namespace
}  // namespace samnode
