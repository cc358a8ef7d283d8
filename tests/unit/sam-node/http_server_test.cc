#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "common/unique_fd.h"
#include "proto/http_syntax.h"
#include "sam-node/http.h"

namespace samnode {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A real server on a real socket in a fresh directory, serving from its own thread.
class Served {
 public:
  explicit Served(Handler handler, ServerLimits limits = {}) {
    dir_ = std::filesystem::temp_directory_path() /
           ("sam-node-http-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "api.sock").string();
    server_ = std::make_unique<HttpServer>(
        path_, std::move(handler),
        [this](std::string_view reason) {
          std::lock_guard lock(mu_);
          refusals_.emplace_back(reason);
        },
        limits);
    thread_ = std::thread([this] { server_->serve(); });
  }
  ~Served() {
    server_->stop();
    thread_.join();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  /// The reasons the server reported to its refusal counter so far.
  [[nodiscard]] std::vector<std::string> refusals() const {
    std::lock_guard lock(mu_);
    return refusals_;
  }

  [[nodiscard]] common::UniqueFd connect() const {
    common::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size());
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    return fd;
  }

 private:
  static inline int counter_ = 0;
  mutable std::mutex mu_;
  std::vector<std::string> refusals_;
  std::filesystem::path dir_;
  std::string path_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

void sendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may close early (413): the test reads its answer
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// Reads until `done(buffer)` or EOF, with a generous deadline (never a timed assertion: the
// deadline only keeps a broken server from hanging the test).
std::string readUntil(int fd, const std::function<bool(const std::string&)>& done) {
  std::string buffer;
  char chunk[65536];
  while (!done(buffer)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 30000) <= 0) break;
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
  }
  return buffer;
}

std::string readToEof(int fd) {
  return readUntil(fd, [](const std::string&) { return false; });
}

size_t count(const std::string& text, std::string_view needle) {
  size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

Handler echo() {
  return [](const Request& req, ResponseWriter& out) {
    sendJson(out, 200,
             "{\"method\":\"" + req.method + "\",\"path\":\"" + req.path + "\",\"query\":\"" +
                 req.query + "\",\"agent\":\"" + req.agent +
                 "\",\"body\":" + std::to_string(req.body.size()) + "}");
  };
}

TEST(HttpServerTest, SocketIsOwnerOnly) {
  Served s(echo());
  struct stat st {};
  ASSERT_EQ(::stat(s.path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(HttpServerTest, RefusesToReplaceAFileThatIsNotASocket) {
  const auto path = std::filesystem::temp_directory_path() / "sam-node-http-not-a-socket";
  std::ofstream(path) << "keep me";
  try {
    HttpServer server(path.string(), echo());
    FAIL() << "replaced a regular file";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a socket"));
  }
  EXPECT_TRUE(std::filesystem::exists(path));
  std::filesystem::remove(path);
}

TEST(HttpServerTest, PipelinedKeepAliveRequests) {
  Served s(echo());
  auto fd = s.connect();
  sendAll(fd.get(),
          "GET /v1/models?x=1 HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Sam-Agent: a.example\r\n\r\n"
          "POST /mcp HTTP/1.1\r\nHost: mesh.sam.alt\r\nContent-Length: 5\r\n\r\nhello"
          "GET /last HTTP/1.1\r\nHost: mesh.sam.alt\r\nConnection: close\r\n\r\n");
  const std::string all = readToEof(fd.get());
  EXPECT_EQ(count(all, "HTTP/1.1 200 OK"), 3u) << all;
  EXPECT_THAT(all, HasSubstr(R"("path":"/v1/models","query":"x=1","agent":"a.example")"));
  EXPECT_THAT(all, HasSubstr(R"("method":"POST","path":"/mcp","query":"","agent":"","body":5)"));
  EXPECT_THAT(all, HasSubstr(R"("path":"/last")"));
  EXPECT_THAT(all, HasSubstr("Connection: close"));
}

TEST(HttpServerTest, ChunkedRequestBody) {
  Served s(echo());
  auto fd = s.connect();
  sendAll(fd.get(),
          "POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
          "3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n");
  EXPECT_THAT(readToEof(fd.get()), HasSubstr(R"("body":7)"));
}

TEST(HttpServerTest, MalformedRequestIs400AndClosed) {
  Served s(echo());
  for (const char* bad :
       {"GARBAGE \x01\x02 NOT HTTP\r\n\r\n", "GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"}) {
    SCOPED_TRACE(bad);
    auto fd = s.connect();
    sendAll(fd.get(), bad);
    const std::string answer = readToEof(fd.get());
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 400 "));
    EXPECT_THAT(answer, HasSubstr("malformed request"));
  }
}

// Sends each of `requests` on a connection of its own to a server whose handler must never
// run; each gets exactly one 400 that mentions `why`.
void expectOne400Each(std::initializer_list<std::string> requests, std::string_view why) {
  bool called = false;
  Served s([&](const Request& req, ResponseWriter& out) {
    called = true;
    echo()(req, out);
  });
  for (const auto& bad : requests) {
    SCOPED_TRACE(bad);
    auto fd = s.connect();
    sendAll(fd.get(), bad);
    const std::string answer = readToEof(fd.get());
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 400 "));
    EXPECT_THAT(answer, HasSubstr(std::string(why)));
    EXPECT_EQ(count(answer, "HTTP/1.1 "), 1U);
  }
  EXPECT_FALSE(called);
  EXPECT_EQ(s.refusals().size(), requests.size());
}

TEST(HttpServerTest, AFieldNameWithSpaceBeforeTheColonIs400AndNoHandlerRuns) {
  // "Host :" would pass the node's field filters by name and reach the upstream as written.
  expectOne400Each({"GET / HTTP/1.1\r\nHost : evil.example\r\n\r\n",
                    "GET / HTTP/1.1\r\nAuthorization  : Bearer k\r\n\r\n"},
                   "is not a token");
}

TEST(HttpServerTest, TrailerFieldsAre400NeverHeadFields) {
  // Joined to the head, a trailer skipped every head check: an identity taken from it, a
  // "Host :" forwarded upstream as written.
  const std::string chunked =
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n";
  expectOne400Each(
      {chunked + "X-Sam-Agent: w1.writers.example\r\n\r\n", chunked + "Host : evil.example\r\n\r\n",
       chunked + "X-Trailer-Token: 1\r\n\r\n"},
      "trailer fields");
  // A chunked body without trailers is served.
  Served s(echo());
  auto fd = s.connect();
  sendAll(fd.get(),
          "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
          "3\r\nabc\r\n0\r\n\r\n");
  EXPECT_THAT(readToEof(fd.get()), StartsWith("HTTP/1.1 200 "));
}

TEST(HttpServerTest, AnUpgradeOrConnectGetsOne400AndNoHandlerRuns) {
  expectOne400Each(
      {"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
       "GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\nPRI * HTTP/2.0\r\n",
       "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"},
      "upgrade-not-supported");
}

TEST(HttpServerTest, AHeadOfManySmallFieldsIs431) {
  // 65,000 empty fields fit in 64 KiB of wire bytes but not in memory: the field count is
  // limited as well.
  Served s(echo());
  std::string head = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 101; ++i) head += "a:\r\n";
  head += "\r\n";
  auto fd = s.connect();
  sendAll(fd.get(), head);
  const std::string answer = readToEof(fd.get());
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 431 "));
  EXPECT_THAT(answer, HasSubstr("more than 100 header fields"));
  // 100 fields are still a request.
  std::string fine = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 99; ++i) fine += "a:\r\n";
  fine += "Connection: close\r\n\r\n";
  auto ok = s.connect();
  sendAll(ok.get(), fine);
  EXPECT_THAT(readToEof(ok.get()), StartsWith("HTTP/1.1 200 "));
}

TEST(HttpServerTest, DeclaredOversizedBodyIs413BeforeTheBodyIsRead) {
  bool called = false;
  Served s([&](const Request&, ResponseWriter& out) {
    called = true;
    sendJson(out, 200, "{}");
  });
  auto fd = s.connect();
  sendAll(fd.get(), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                        std::to_string(kMaxRequestBody + 1) + "\r\n\r\n");
  EXPECT_THAT(readToEof(fd.get()), StartsWith("HTTP/1.1 413 "));
  EXPECT_FALSE(called);
}

TEST(HttpServerTest, ChunkedOversizedBodyIs413) {
  Served s(echo());
  auto fd = s.connect();
  std::thread writer([&] {
    sendAll(fd.get(), "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    const std::string piece(1 << 20, 'a');
    char size[16];
    std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
    for (size_t sent = 0; sent <= kMaxRequestBody; sent += piece.size())
      sendAll(fd.get(), std::string(size) + piece + "\r\n");
    ::shutdown(fd.get(), SHUT_WR);
  });
  const std::string answer = readToEof(fd.get());
  writer.join();
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 413 "));
}

TEST(HttpServerTest, StreamedResponseArrivesBeforeTheHandlerFinishes) {
  std::promise<void> client_saw_first;
  auto saw = client_saw_first.get_future();
  Served s([&](const Request& req, ResponseWriter& out) {
    if (req.path == "/again") {
      sendJson(out, 200, "{}");
      return;
    }
    ASSERT_TRUE(out.begin(200, {{"Content-Type", "text/event-stream"}, {"Content-Length", "9"}},
                          std::nullopt));
    ASSERT_TRUE(out.write("data: one\n\n"));
    saw.wait();  // the client has read the first event while this response is still open
    ASSERT_TRUE(out.write("data: two\n\n"));
    ASSERT_TRUE(out.finish());
  });
  auto fd = s.connect();
  sendAll(fd.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string first =
      readUntil(fd.get(), [](const std::string& b) { return b.find("data: one") != b.npos; });
  EXPECT_THAT(first, HasSubstr("Transfer-Encoding: chunked"));
  EXPECT_THAT(first, Not(HasSubstr("Content-Length")));  // hop-by-hop: the writer's own
  EXPECT_THAT(first, Not(HasSubstr("data: two")));
  client_saw_first.set_value();
  const std::string rest =
      readUntil(fd.get(), [](const std::string& b) { return b.find("0\r\n\r\n") != b.npos; });
  EXPECT_THAT(rest, HasSubstr("b\r\ndata: two\n\n\r\n0\r\n\r\n"));
  // The connection stays usable after a chunked response.
  sendAll(fd.get(), "GET /again HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(readToEof(fd.get()), StartsWith("HTTP/1.1 200 OK"));
}

TEST(HttpServerTest, HandlerThatAnswersNothingGets500) {
  Served s([](const Request&, ResponseWriter&) {});
  auto fd = s.connect();
  sendAll(fd.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(readToEof(fd.get()), StartsWith("HTTP/1.1 500 "));
}

TEST(HttpServerTest, StopEndsIdleKeepAliveConnections) {
  auto s = std::make_unique<Served>(echo());
  auto fd = s->connect();
  sendAll(fd.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  readUntil(fd.get(), [](const std::string& b) { return b.find("}") != b.npos; });
  s.reset();  // returns only once the idle connection's thread has ended
  EXPECT_EQ(readToEof(fd.get()), "");
}

TEST(HttpServerTest, SendWithLengthArrivesWhole) {
  Served s([](const Request&, ResponseWriter& out) {
    ASSERT_TRUE(out.begin(200, {{"Content-Type", "text/plain"}}, 5));
    ASSERT_TRUE(out.write("he"));
    ASSERT_TRUE(out.write("llo"));
    ASSERT_TRUE(out.finish());
  });
  auto fd = s.connect();
  sendAll(fd.get(), "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string all = readToEof(fd.get());
  EXPECT_THAT(all, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(all, HasSubstr("Content-Length: 5\r\n"));
  EXPECT_THAT(all, Not(HasSubstr("chunked")));
  EXPECT_THAT(all, testing::EndsWith("\r\n\r\nhello"));
}

TEST(HttpServerTest, IdleKeepAliveConnectionIsClosedAtTheIdleLimit) {
  Served s(echo(), {.idle_timeout = std::chrono::milliseconds(200)});
  auto fd = s.connect();
  sendAll(fd.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  // The answer, then the server's close once the connection has idled past the limit.
  EXPECT_THAT(readToEof(fd.get()), StartsWith("HTTP/1.1 200 OK"));
  EXPECT_THAT(s.refusals(), testing::ElementsAre("idle-timeout"));
}

TEST(HttpServerTest, SlowRequestHeadIs408AtTheHeadLimit) {
  Served s(echo(), {.head_timeout = std::chrono::milliseconds(300)});
  auto fd = s.connect();
  sendAll(fd.get(), "GET / HTTP/1.1\r\nHost: x\r\nX-Slow");  // and nothing more
  const std::string answer = readToEof(fd.get());
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 408 "));
  EXPECT_THAT(answer, HasSubstr("request head not complete"));
  EXPECT_THAT(s.refusals(), testing::ElementsAre("request-head-timeout"));
}

// Whether `fd` has something to read (an answer or the close) within `ms`.
bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

TEST(HttpServerTest, AFullServerClosesASlowRequestToMakeRoom) {
  using std::chrono::milliseconds;
  Served s(echo(), {.connections = 2, .slow_request = milliseconds(100)});
  auto body = s.connect();  // a body that stops half-way
  sendAll(body.get(), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab");
  auto head = s.connect();  // a head that stops half-way
  sendAll(head.get(), "GET / HTTP/1.1\r\nHost: x\r\nX-Slow");
  std::this_thread::sleep_for(milliseconds(300));
  auto fresh = s.connect();
  sendAll(fresh.get(), "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(readToEof(fresh.get()), StartsWith("HTTP/1.1 200 OK"));
  // One of the two trickling requests was closed with a 408 to let it in; the other waits on.
  const bool first = readable(body.get(), 2000);
  const int evicted = first ? body.get() : head.get();
  const std::string answer = readToEof(evicted);
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 408 "));
  EXPECT_THAT(answer, HasSubstr("slow-request-evicted"));
  EXPECT_FALSE(readable(first ? head.get() : body.get(), 200));
  EXPECT_THAT(s.refusals(), testing::ElementsAre("slow-request-evicted"));
}

TEST(HttpServerTest, AFullServerRefusesWhenNoConnectionMayBeClosed) {
  // Both requests arriving, but not for longer than slow_request: neither is closed.
  Served s(echo(), {.connections = 1, .slow_request = std::chrono::minutes(1)});
  auto held = s.connect();
  sendAll(held.get(), "GET / HTTP/1.1\r\nHost: x\r\nX-Slow");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto refused = s.connect();
  EXPECT_THAT(readToEof(refused.get()), StartsWith("HTTP/1.1 503 "));
  EXPECT_FALSE(readable(held.get(), 100));
}

TEST(HttpServerTest, BodiesPastTheBudgetAre503AndTheBudgetComesBack) {
  Served s(echo(), {.bodies_held = size_t{6} << 20});  // 1 MiB of bodies: kBodyMemoryFactor 6
  auto big = s.connect();
  sendAll(big.get(), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n" +
                         std::string(size_t{2} << 20, 'a'));
  const std::string answer = readToEof(big.get());
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 503 "));
  EXPECT_THAT(answer, HasSubstr("node-busy"));
  for (int i = 0; i < 3; ++i) {  // what it held was given back: 3 x 768 KiB one after another
    auto fd = s.connect();
    sendAll(fd.get(),
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 786432\r\n"
            "Connection: close\r\n\r\n" +
                std::string(786432, 'a'));
    EXPECT_THAT(readToEof(fd.get()), StartsWith("HTTP/1.1 200 OK"));
  }
  // Its raw bytes fit the 6 MiB, its parsed copies would not.
  auto fd = s.connect();
  sendAll(fd.get(), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1572864\r\n\r\n" +
                        std::string(size_t{1572864}, 'a'));
  EXPECT_THAT(readToEof(fd.get()), StartsWith("HTTP/1.1 503 "));
}

TEST(HttpServerTest, AClientThatNeverReadsItsAnswersIsClosed) {
  // Pipelined requests, answers never read: the server's writes stall, and after send_timeout
  // with no progress the connection is closed rather than held for ever.
  Served s([](const Request&, ResponseWriter& out) { sendJson(out, 200, std::string(65536, 'x')); },
           {.send_timeout = std::chrono::milliseconds(200)});
  auto fd = s.connect();
  std::string burst;
  for (int i = 0; i < 200; ++i) burst += "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  sendAll(fd.get(), burst);
  // Not reading, until the server has given up (bounded: a broken server fails the test).
  for (int waited = 0; waited < 300; ++waited) {
    const auto r = s.refusals();
    if (std::find(r.begin(), r.end(), "send-timeout") != r.end()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(s.refusals(), testing::Contains("send-timeout"));
  // What it had queued can still be read, then the close: far fewer than 200 answers.
  EXPECT_LT(count(readToEof(fd.get()), "HTTP/1.1 200 OK"), 200u);
}

TEST(HttpServerTest, MalformedRequestIsCountedAsARefusal) {
  Served s(echo());
  auto fd = s.connect();
  sendAll(fd.get(), "GARBAGE \x01\r\n\r\n");
  EXPECT_THAT(readToEof(fd.get()), StartsWith("HTTP/1.1 400 "));
  EXPECT_THAT(s.refusals(), testing::ElementsAre("malformed-request"));
}

TEST(HttpServerTest, FindHeaderIgnoresCase) {
  const Headers h = {{"Content-Type", "a"}, {"x-sam-agent", "b"}, {"X-Sam-Agent", "c"}};
  EXPECT_EQ(findHeader(h, "content-type"), "a");
  EXPECT_EQ(findHeader(h, "X-SAM-AGENT"), "b");
  EXPECT_EQ(findHeader(h, "missing"), std::nullopt);
}

TEST(HttpServerTest, FieldNamesAreTokens) {
  for (const char* good : {"Content-Type", "x-sam-agent", "X_Odd", "a!#$%&'*+-.^_`|~9"})
    EXPECT_TRUE(proto::isToken(good)) << good;
  for (std::string_view bad :
       {std::string_view(""), std::string_view("Bad Name"), std::string_view("a:b"),
        std::string_view("a\rb"), std::string_view("a\nb"), std::string_view("a\0b", 3),
        std::string_view(" lead"), std::string_view("a\"b"), std::string_view("a(b)"),
        std::string_view("\xc3\xa9")})
    EXPECT_FALSE(proto::isToken(bad)) << bad;
}

TEST(HttpServerTest, FieldValuesHaveNoLineBreaksOrControls) {
  for (const char* good : {"", "text/plain; charset=utf-8", "a\tb", "\xc3\xa9", "~!@#"})
    EXPECT_TRUE(proto::isFieldValue(good)) << good;
  for (std::string_view bad :
       {std::string_view("a\rInjected: b"), std::string_view("a\nb"), std::string_view("a\0b", 3),
        std::string_view("a\x01"), std::string_view("a\x7f")})
    EXPECT_FALSE(proto::isFieldValue(bad)) << bad;
}

TEST(HttpServerTest, WriterRefusesFieldsThatWouldSplitTheHead) {
  int seen_status = -1;
  Served s([&](const Request&, ResponseWriter& out) {
    EXPECT_EQ(out.status(), 0);
    out.send(200,
             {{"X-Evil", "a\rInjected: b"},
              {"Bad Name", "v"},
              {"X-Split", "a\r\nInjected: c"},
              {"X-Fine", "yes"}},
             "ok");
    seen_status = out.status();
  });
  auto fd = s.connect();
  sendAll(fd.get(), "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string all = readToEof(fd.get());
  const std::string head = all.substr(0, all.find("\r\n\r\n"));
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(head, HasSubstr("X-Fine: yes\r\n"));
  EXPECT_THAT(head, Not(HasSubstr("Injected")));
  EXPECT_THAT(head, Not(HasSubstr("Bad Name")));
  EXPECT_THAT(all, testing::EndsWith("\r\n\r\nok"));
  EXPECT_EQ(seen_status, 200);
  EXPECT_THAT(s.refusals(), testing::ElementsAre("bad-response-field"));
}

}  // namespace
}  // namespace samnode
