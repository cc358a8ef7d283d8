// Lines from a microVM guest's control port are the guest's bytes (its root is not the host's):
// GuestRuleset::onLine() must take any line without crashing, consume exactly the lines that
// start with "allowed ", and never report an answer for a batch nobody sent.
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "compass-runner/microvm_control.h"
#include "compass-runner/microvm_egress.h"

namespace {

runner::microvm::ControlChannel& channel() {
  static runner::microvm::ControlChannel* c = [] {
    char dir[] = "/tmp/guest-control-fuzz-XXXXXX";
    if (::mkdtemp(dir) == nullptr) ::abort();
    const std::string path = std::string(dir) + "/control.sock";
    auto* ch = new runner::microvm::ControlChannel(path);
    ::unlink(path.c_str());  // the listening socket stays; nothing is left in /tmp
    ::rmdir(dir);
    return ch;
  }();
  return *c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static runner::microvm::GuestRuleset ruleset(channel(), std::chrono::milliseconds(1));
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const std::string line(rest.substr(0, nl));
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    const bool consumed = ruleset.onLine(line);
    if (consumed != (line.rfind("allowed ", 0) == 0)) ::abort();
  }
  // No guest is connected: a batch can never be sent, so it can never be answered.
  if (ruleset.apply("add element inet compass_egress allow4 { 192.0.2.1 }")) ::abort();
  return 0;
}
