// OIDC discovery and JWKS retrieval against a real local HTTPS issuer
// (tests/integration/oidc_issuer.py, run as a subprocess with Debian's python3).

#include "policy/oidc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "policy/jwt.h"

extern char** environ;

namespace policy {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr char kPython[] = "/usr/bin/python3";
constexpr auto kStartupDeadline = 10s;

std::string issuerScript() {
  return std::string(COMPASS_SOURCE_DIR) + "/tests/integration/oidc_issuer.py";
}

// A child process with its stdout on a pipe. The destructor always reaps it (SIGTERM, then
// SIGKILL), so a failing assertion never leaves an issuer behind.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    common::UniqueFd read_end(fds[0]);
    common::UniqueFd write_end(fds[1]);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    out_ = std::move(read_end);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(10ms);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  // Reads stdout until `stop_at_newline` sees a line end, EOF, or the deadline passes.
  std::string read(bool stop_at_newline) {
    std::string text;
    auto deadline = std::chrono::steady_clock::now() + kStartupDeadline;
    while (pid_ > 0 && out_.valid()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{out_.get(), POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      ssize_t n = ::read(out_.get(), buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
      if (stop_at_newline && text.find('\n') != std::string::npos) break;
    }
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return text;
  }

 private:
  pid_t pid_ = -1;
  common::UniqueFd out_;
};

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "oidc_test.XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) fs::remove_all(path_, ignored);
  }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// RSA-2048 generation costs up to a second on a loaded machine; one key, generated here with
// OpenSSL and written into each issuer's directory (where oidc_issuer.py picks it up), keeps
// the whole suite within a few seconds.
const std::string& sharedRsaKeyPem() {
  static const std::string kPem = [] {
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_RSA_gen(2048), EVP_PKEY_free);
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
    PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr);
    char* data = nullptr;
    long len = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<size_t>(len));
  }();
  return kPem;
}

// One issuer process for one test; `extra` are CLI options such as --advertise-issuer.
class Issuer {
 public:
  explicit Issuer(const std::vector<std::string>& extra = {})
      : child_(argv(dir_.path(), extra)), url_(child_.read(true)) {}
  [[nodiscard]] const std::string& url() const { return url_; }
  [[nodiscard]] std::string caFile() const { return dir_.path() + "/ca.pem"; }
  [[nodiscard]] std::string otherCaFile() const { return dir_.path() + "/other-ca.pem"; }
  [[nodiscard]] OidcFetchOptions options() const { return {url_, caFile(), 5000ms}; }

  // An RS256 and an ES256 token signed with the issuer's published keys, minted by the Python
  // side, so the test also proves both ends agree on the wire encodings (ES256 raw r||s).
  [[nodiscard]] std::vector<std::string> mint(const std::string& sub,
                                              const std::string& aud) const {
    Child minter({kPython, issuerScript(), "mint", "--dir", dir_.path(), "--alg", "RS256", "--alg",
                  "ES256", "--sub", sub, "--aud", aud});
    std::string out = minter.read(false);
    size_t nl = out.find('\n');
    if (nl == std::string::npos) return {out};
    return {out.substr(0, nl), out.substr(nl + 1)};
  }

 private:
  static std::vector<std::string> argv(const std::string& dir,
                                       const std::vector<std::string>& extra) {
    std::ofstream(dir + "/rsa-key.pem") << sharedRsaKeyPem();
    std::vector<std::string> args = {kPython, issuerScript(), "--dir", dir, "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  TempDir dir_;
  Child child_;
  std::string url_;
};

std::string fetchVerdict(const OidcFetchOptions& opts) {
  try {
    return "ok:" + std::to_string(fetchIssuerJwks(opts).size());
  } catch (const CredentialError& e) {
    return e.reason();
  }
}

// A port on 127.0.0.1 with nothing listening: bound, then released.
int closedPort() {
  common::UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return 1;  // tcpmux: nothing listens there either
  }
  return ntohs(addr.sin_port);
}

TEST(OidcTest, FetchesJwksAndVerifiesMintedTokens) {
  Issuer issuer;
  ASSERT_EQ(issuer.url().rfind("https://127.0.0.1:", 0), 0u) << issuer.url();
  Jwks keys = fetchIssuerJwks(issuer.options());
  EXPECT_EQ(keys.size(), 2u);

  const std::string sub = "system:serviceaccount:agents:researcher";
  std::vector<std::string> tokens = issuer.mint(sub, "compass");
  ASSERT_EQ(tokens.size(), 2u);
  for (const std::string& token : tokens) {
    VerifiedClaims claims = verifyJwt(token, keys, {issuer.url(), "compass", sub});
    EXPECT_EQ(claims.subject, sub) << token;
  }
}

TEST(OidcTest, RefusesIssuerThatIsNotExactlyTheAdvertisedOne) {
  Issuer issuer;
  OidcFetchOptions opts = issuer.options();
  // The well-known path is found (the "/" is stripped), but the document names the issuer
  // without it, and §4.3 wants an exact match.
  opts.issuer = issuer.url() + "/";
  EXPECT_EQ(fetchVerdict(opts), "bad-discovery");
  opts.issuer = issuer.url() + "/elsewhere";  // 404
  EXPECT_EQ(fetchVerdict(opts), "issuer-unreachable");
}

TEST(OidcTest, RefusesUntrustedCertificate) {
  Issuer issuer;
  OidcFetchOptions opts = issuer.options();
  opts.ca_file = issuer.otherCaFile();
  EXPECT_EQ(fetchVerdict(opts), "issuer-unreachable");
  opts.ca_file.clear();  // system store: the throwaway CA is not in it
  EXPECT_EQ(fetchVerdict(opts), "issuer-unreachable");
  opts.ca_file = issuer.caFile() + ".missing";
  EXPECT_EQ(fetchVerdict(opts), "issuer-unreachable");
}

TEST(OidcTest, RefusesDiscoveryNamingAnotherIssuer) {
  Issuer issuer({"--advertise-issuer", "https://attacker.test"});
  EXPECT_EQ(fetchVerdict(issuer.options()), "bad-discovery");
}

TEST(OidcTest, RefusesPlainHttpJwksUri) {
  Issuer issuer({"--jwks-uri", "http://127.0.0.1:1/jwks"});
  EXPECT_EQ(fetchVerdict(issuer.options()), "bad-discovery");
}

TEST(OidcTest, RefusesOversizedJwks) {
  // Sent without Content-Length, so only the cap enforced while reading can stop it.
  Issuer issuer({"--pad-jwks", std::to_string(kMaxJwksBytes + 1)});
  EXPECT_EQ(fetchVerdict(issuer.options()), "bad-jwks");
}

TEST(OidcTest, RefusesPlainHttpIssuer) {
  EXPECT_EQ(fetchVerdict({"http://127.0.0.1:" + std::to_string(closedPort()), "", 1000ms}),
            "bad-discovery");
  EXPECT_EQ(fetchVerdict({"", "", 1000ms}), "bad-discovery");
}

TEST(OidcTest, UnreachablePortIsReported) {
  EXPECT_EQ(fetchVerdict({"https://127.0.0.1:" + std::to_string(closedPort()), "", 2000ms}),
            "issuer-unreachable");
}

TEST(OidcTest, SilentServerTimesOut) {
  // Listening but never accepting: the kernel completes TCP, TLS never starts.
  common::UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(s.get(), 4), 0);
  getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(fetchVerdict({"https://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), "", 300ms}),
            "issuer-unreachable");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

}  // namespace
}  // namespace policy
