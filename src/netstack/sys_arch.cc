// The functions lwIP's NO_SYS port needs from us: a millisecond clock for its timers, random
// numbers (initial ports), a sink for its debug output (only with LWIP_DEBUG), and the
// checksum routine (LWIP_CHKSUM, arch/cc.h) for the segments it sends.

#include <sys/random.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include "checksum.h"  // compiled into lwip_core, whose include path has no src/

extern "C" {

uint32_t sys_now(void) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  return static_cast<uint32_t>(
      duration_cast<milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

uint32_t netstack_lwip_rand(void) {
  uint32_t value = 0;
  if (getrandom(&value, sizeof value, GRND_NONBLOCK) != sizeof value) {
    // Early boot without entropy: a clock-derived value is enough for lwIP's uses (ports).
    value = sys_now() * 2654435761U;
  }
  return value;
}

uint16_t netstack_lwip_chksum(const void* data, int len) {
  return netstack::onesSumMemoryOrder(data, len > 0 ? static_cast<size_t>(len) : 0);
}

void netstack_lwip_diag(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::fputs("lwip: ", stderr);
  std::vfprintf(stderr, format, args);
  va_end(args);
}

}  // extern "C"
