// The three functions lwIP's NO_SYS port needs from us: a millisecond clock for its timers,
// random numbers (initial ports), and a sink for its debug output (only with LWIP_DEBUG).

#include <sys/random.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>

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

void netstack_lwip_diag(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::fputs("lwip: ", stderr);
  std::vfprintf(stderr, format, args);
  va_end(args);
}

}  // extern "C"
