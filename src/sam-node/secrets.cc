#include "sam-node/secrets.h"

#include "common/unique_fd.h"

#include <fcntl.h>
#include <libsecret/secret.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace samnode {
namespace {

/// Largest secret file read (bytes): a secret is a token or a key, not a document; a bigger
/// file is a misconfiguration (or the wrong path), refused rather than read whole.
constexpr size_t kMaxSecretBytes = 64 * 1024;
/// Longest bare secret name (bytes); it becomes a file name or a variable name.
constexpr size_t kMaxNameBytes = 255;

constexpr std::string_view kFileScheme = "file://";
constexpr std::string_view kEnvScheme = "env://";
constexpr std::string_view kKeyringScheme = "keyring://";

enum class Provider { kFile, kEnv, kKeyring };

struct ParsedRef {
  Provider provider;
  std::string target;  ///< file: absolute path; env: variable; keyring: item name
};

[[noreturn]] void fail(std::string_view ref, std::string_view reason) {
  throw SecretError(std::string(ref) + ": " + std::string(reason));
}

/// A bare name or a keyring item name: it must not be able to name another file once joined
/// to <data_dir>/secrets/, so no '/', no "..", no control bytes.
void checkName(std::string_view ref, std::string_view name) {
  if (name.empty()) fail(ref, "empty secret name");
  if (name.size() > kMaxNameBytes) fail(ref, "secret name longer than 255 bytes");
  if (name.find('/') != std::string_view::npos) fail(ref, "secret name contains '/'");
  if (name.find("..") != std::string_view::npos) fail(ref, "secret name contains \"..\"");
  for (unsigned char c : name) {
    if (c < 0x21 || c > 0x7e) fail(ref, "secret name contains a space or a non-printable byte");
  }
}

/// POSIX portable environment variable names (IEEE Std 1003.1, 8.1): [A-Za-z_][A-Za-z0-9_]*.
bool isVariableName(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name) {
    bool ok =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

Provider parseProvider(std::string_view name) {
  if (name == "file") return Provider::kFile;
  if (name == "env") return Provider::kEnv;
  if (name == "keyring") return Provider::kKeyring;
  throw SecretError("COMPASS_SECRET_PROVIDER: unknown provider \"" + std::string(name) +
                    "\" (expected file, env or keyring)");
}

ParsedRef parseRef(std::string_view ref, const std::string& data_dir, Provider fallback) {
  if (ref.starts_with(kFileScheme)) {
    std::string path(ref.substr(kFileScheme.size()));
    if (path.empty()) fail(ref, "file:// needs an absolute path (file:///path)");
    if (path[0] != '/') {
      fail(ref, "file:// needs an absolute path (file:///path); relative paths are refused");
    }
    if (path.find('\0') != std::string::npos) fail(ref, "path contains a NUL byte");
    return {Provider::kFile, path};
  }
  if (ref.starts_with(kEnvScheme)) {
    std::string var(ref.substr(kEnvScheme.size()));
    if (!isVariableName(var)) {
      fail(ref,
           "env:// needs a variable name of letters, digits and '_', not starting with a "
           "digit");
    }
    return {Provider::kEnv, var};
  }
  if (ref.starts_with(kKeyringScheme)) {
    std::string name(ref.substr(kKeyringScheme.size()));
    checkName(ref, name);
    return {Provider::kKeyring, name};
  }
  if (ref.find("://") != std::string_view::npos) {
    fail(ref, "unknown secret provider (expected file://, env://, keyring:// or a bare name)");
  }
  checkName(ref, ref);
  std::string name(ref);
  switch (fallback) {
    case Provider::kFile:
      return {Provider::kFile, data_dir + "/secrets/" + name};
    case Provider::kEnv: {
      std::string var;
      for (char c : name) {
        if (c == '-') {
          var += '_';
        } else {
          var += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
        }
      }
      if (!isVariableName(var)) {
        fail(ref,
             "with the env provider the name must map to a variable name (got \"" + var + "\")");
      }
      return {Provider::kEnv, var};
    }
    case Provider::kKeyring:
      return {Provider::kKeyring, name};
  }
  fail(ref, "unknown secret provider");
}

std::string readFile(std::string_view ref, const std::string& path) {
  // O_NONBLOCK: a FIFO at the path must not hang the node (it is refused below anyway).
  common::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) fail(ref, "cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(ref, "cannot stat " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(ref, path + " is not a regular file");
  std::string value;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(ref, "cannot read " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    value.append(buf, static_cast<size_t>(n));
    if (value.size() > kMaxSecretBytes) fail(ref, path + " is larger than 64 KiB");
  }
  // Editors and `echo` end files with a newline that is not part of the token.
  if (!value.empty() && value.back() == '\n') value.pop_back();
  if (value.empty()) fail(ref, path + " is empty");
  return value;
}

std::string readEnv(std::string_view ref, const std::string& var) {
  const char* value = std::getenv(var.c_str());
  if (value == nullptr) fail(ref, "environment variable " + var + " is not set");
  if (*value == '\0') fail(ref, "environment variable " + var + " is empty");
  return value;
}

/// The schema under which compass secrets are stored: one attribute naming the secret, so
/// `secret-tool store --label=x compass-secret NAME` creates an item we find.
const SecretSchema* compassSchema() {
  static const SecretSchema schema = [] {
    SecretSchema s{};
    s.name = "org.compass.Secret";
    s.flags = SECRET_SCHEMA_NONE;
    s.attributes[0] = {"compass-secret", SECRET_SCHEMA_ATTRIBUTE_STRING};
    return s;
  }();
  return &schema;
}

struct GErrorFree {
  void operator()(GError* e) const { g_error_free(e); }
};
struct SecretPasswordFree {
  void operator()(gchar* p) const { secret_password_free(p); }
};

std::string readKeyring(std::string_view ref, const std::string& name) {
  GError* raw_error = nullptr;
  std::unique_ptr<gchar, SecretPasswordFree> value(secret_password_lookup_sync(
      compassSchema(), nullptr, &raw_error, "compass-secret", name.c_str(), nullptr));
  std::unique_ptr<GError, GErrorFree> error(raw_error);
  if (error) {
    // Errors of the bus itself (no session bus, no org.freedesktop.secrets owner) mean there
    // is no keyring to ask; Secret Service errors (locked, protocol) mean there is one.
    std::string message = error->message != nullptr ? error->message : "unknown error";
    if (error->domain == G_IO_ERROR || error->domain == G_DBUS_ERROR) {
      fail(ref, "no Secret Service reachable (" + message + ")");
    }
    fail(ref, "Secret Service lookup failed (" + message + ")");
  }
  if (!value) fail(ref, "no keyring item with compass-secret=" + name);
  std::string out(value.get());
  if (out.empty()) fail(ref, "the keyring item is empty");
  return out;
}

}  // namespace

SecretStore::SecretStore(std::string data_dir, std::string default_provider)
    : data_dir_(std::move(data_dir)), default_provider_(std::move(default_provider)) {
  parseProvider(default_provider_);
}

void SecretStore::validate(std::string_view ref) const {
  parseRef(ref, data_dir_, parseProvider(default_provider_));
}

std::string SecretStore::variableOf(std::string_view ref) const {
  try {
    ParsedRef parsed = parseRef(ref, data_dir_, parseProvider(default_provider_));
    return parsed.provider == Provider::kEnv ? parsed.target : "";
  } catch (const SecretError&) {
    return "";
  }
}

std::string SecretStore::read(std::string_view ref) const {
  ParsedRef parsed = parseRef(ref, data_dir_, parseProvider(default_provider_));
  switch (parsed.provider) {
    case Provider::kFile:
      return readFile(ref, parsed.target);
    case Provider::kEnv:
      return readEnv(ref, parsed.target);
    case Provider::kKeyring:
      // A bare name read from the keyring is reported as the keyring:// reference it stands for.
      return readKeyring("keyring://" + parsed.target, parsed.target);
  }
  fail(ref, "unknown secret provider");
}

}  // namespace samnode
