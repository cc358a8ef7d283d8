#include "policy/name.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <charconv>

namespace policy {
namespace {

bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isHexDigit(char c) { return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

void setReason(std::string* reason, std::string_view text) {
  if (reason != nullptr) reason->assign(text);
}

// The last label decides: no top-level domain is numeric (RFC 3696 §2), so "foo.123" or
// "foo.0x1f" can only mean an address to some resolver, never a name we should match.
bool lastLabelIsNumeric(std::string_view host) {
  const size_t dot = host.rfind('.');
  std::string_view label = dot == std::string_view::npos ? host : host.substr(dot + 1);
  if (label.empty()) return false;
  if (std::all_of(label.begin(), label.end(), isDigit)) return true;
  if (label.size() > 2 && label[0] == '0' && (label[1] == 'x' || label[1] == 'X')) {
    return std::all_of(label.begin() + 2, label.end(), isHexDigit);
  }
  return false;
}

bool isIpv6Literal(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (const size_t zone = host.find('%'); zone != std::string_view::npos) {
    host = host.substr(0, zone);
  }
  // Longest textual IPv6 ("ffff:...:255.255.255.255") is 45 bytes; skip the copy beyond.
  if (host.empty() || host.size() > INET6_ADDRSTRLEN) return false;
  const std::string copy(host);
  in6_addr addr{};
  return inet_pton(AF_INET6, copy.c_str(), &addr) == 1;
}

bool isIpv4Literal(std::string_view host) {
  // inet_aton reads up to a NUL, so an embedded NUL would hide a suffix; either way the
  // string is refused as a name later, so treating it as a literal errs on the safe side.
  if (host.empty() || host.size() > 64) return false;
  const std::string copy(host);
  in_addr addr{};
  return inet_aton(copy.c_str(), &addr) != 0;
}

}  // namespace

bool isIpLiteral(std::string_view host) {
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  if (host.empty()) return false;
  return isIpv6Literal(host) || isIpv4Literal(host) || lastLabelIsNumeric(host);
}

std::optional<std::string> normalizeName(std::string_view raw, std::string* reason) {
  if (raw.empty()) {
    setReason(reason, "empty name");
    return std::nullopt;
  }
  if (isIpLiteral(raw)) {
    setReason(reason, "ip literal is not a name");
    return std::nullopt;
  }
  std::string_view name = raw;
  if (name.back() == '.') name.remove_suffix(1);
  if (name.empty()) {
    setReason(reason, "empty name");
    return std::nullopt;
  }
  if (name.size() > kMaxNameBytes) {
    setReason(reason, "name longer than 253 bytes");
    return std::nullopt;
  }
  std::string out;
  out.reserve(name.size());
  size_t label_start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      const size_t len = i - label_start;
      if (len == 0) {
        setReason(reason, "empty label");
        return std::nullopt;
      }
      if (len > kMaxLabelBytes) {
        setReason(reason, "label longer than 63 bytes");
        return std::nullopt;
      }
      if (name[label_start] == '-' || name[i - 1] == '-') {
        setReason(reason, "label starts or ends with '-'");
        return std::nullopt;
      }
      if (i < name.size()) out.push_back('.');
      label_start = i + 1;
      continue;
    }
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x80) {
      setReason(reason, "non-ASCII byte (IDN must be punycode)");
      return std::nullopt;
    }
    if (c >= 'A' && c <= 'Z') {
      out.push_back(static_cast<char>(c - 'A' + 'a'));
    } else if ((c >= 'a' && c <= 'z') || isDigit(static_cast<char>(c)) || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      setReason(reason, "invalid character (only letters, digits, '-' and '.')");
      return std::nullopt;
    }
  }
  return out;
}

std::optional<Authority> parseAuthority(std::string_view text, std::string* reason) {
  Authority result;
  std::string_view host;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) {
      setReason(reason, "'[' without ']'");
      return std::nullopt;
    }
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (rest.empty()) {
      setReason(reason, "missing port");
      return std::nullopt;
    }
    if (rest.front() != ':') {
      setReason(reason, "expected ':' after ']'");
      return std::nullopt;
    }
    port = rest.substr(1);
    if (host.empty()) {
      setReason(reason, "empty host");
      return std::nullopt;
    }
    // Brackets exist only for IPv6 (RFC 3986 §3.2.2); a name in brackets is a smuggling
    // attempt, not a spelling.
    if (!isIpv6Literal(host)) {
      setReason(reason, "bracketed host is not an IPv6 address");
      return std::nullopt;
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      setReason(reason, "missing port");
      return std::nullopt;
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      setReason(reason, "IPv6 address must be in brackets");
      return std::nullopt;
    }
    if (host.find_first_of("[]") != std::string_view::npos) {
      setReason(reason, "misplaced bracket");
      return std::nullopt;
    }
    if (host.empty()) {
      setReason(reason, "empty host");
      return std::nullopt;
    }
  }
  if (port.empty()) {
    setReason(reason, "missing port");
    return std::nullopt;
  }
  if (!std::all_of(port.begin(), port.end(), isDigit)) {
    setReason(reason, "port is not a decimal number");
    return std::nullopt;
  }
  // One spelling per port: "080" and "0443" are refused rather than guessed at.
  if (port.front() == '0') {
    setReason(reason, port.size() == 1 ? "port out of range" : "port has leading zeros");
    return std::nullopt;
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value > 65535) {
    setReason(reason, "port out of range");
    return std::nullopt;
  }
  result.host.assign(host);
  result.port = static_cast<uint16_t>(value);
  return result;
}

}  // namespace policy
