#include "compass-runner/microvm_egress.h"

#include <charconv>
#include <string_view>

namespace runner::microvm {
namespace {

constexpr int kPending = -1;  // answers_ value while no answer came

bool parseNumber(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

}  // namespace

GuestRuleset::GuestRuleset(ControlChannel& control, std::chrono::milliseconds timeout)
    : control_(control), timeout_(timeout) {}

bool GuestRuleset::apply(const std::string& batch) {
  // One line: nft takes ';' between commands as it takes newlines.
  std::string commands;
  for (char c : batch) commands += c == '\n' ? ';' : c;
  while (!commands.empty() && commands.back() == ';') commands.pop_back();
  if (commands.empty()) return true;
  std::unique_lock lock(mu_);
  if (closed_) return false;
  const uint64_t seq = next_seq_++;
  answers_[seq] = kPending;
  // Sent under the lock: "allowed" cannot be read before its entry exists.
  if (!control_.sendLine("allow " + std::to_string(seq) + " " + commands)) {
    answers_.erase(seq);
    return false;
  }
  const bool answered =
      cv_.wait_for(lock, timeout_, [&] { return closed_ || answers_[seq] != kPending; });
  const int status = answers_[seq];
  answers_.erase(seq);
  return answered && status == 0;
}

bool GuestRuleset::onLine(const std::string& line) {
  constexpr std::string_view kAllowed = "allowed ";
  if (line.rfind(kAllowed, 0) != 0) return false;
  const std::string_view rest = std::string_view(line).substr(kAllowed.size());
  const size_t space = rest.find(' ');
  uint64_t seq = 0, status = 0;
  if (space == std::string_view::npos || !parseNumber(rest.substr(0, space), &seq) ||
      !parseNumber(rest.substr(space + 1), &status)) {
    return true;
  }
  {
    std::lock_guard lock(mu_);
    const auto it = answers_.find(seq);
    if (it == answers_.end() || it->second != kPending) return true;
    it->second = status > 255 ? 255 : static_cast<int>(status);
  }
  cv_.notify_all();
  return true;
}

void GuestRuleset::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

}  // namespace runner::microvm
