#pragma once
// lwIP's platform header for nano-init: Linux, glibc or musl, little- or big-endian from
// <endian.h>. A failed lwIP assertion means lwIP's own state is broken, so nano-init stops
// rather than carry on with a corrupt stack (fail closed).

#include <endian.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif
uint32_t netstack_lwip_rand(void);
uint16_t netstack_lwip_chksum(const void* data, int len);
void netstack_lwip_diag(const char* format, ...) __attribute__((format(printf, 1, 2)));
#ifdef __cplusplus
}
#endif

#define LWIP_RAND() netstack_lwip_rand()
// Eight bytes per step instead of lwIP's four (src/netstack/checksum.h); same result.
#define LWIP_CHKSUM netstack_lwip_chksum
#define LWIP_PLATFORM_DIAG(x) netstack_lwip_diag x
#define LWIP_PLATFORM_ASSERT(x)                                                \
  do {                                                                         \
    fprintf(stderr,                                                            \
            "{\"level\":\"error\",\"msg\":\"lwip assertion\",\"what\":\"%s\"," \
            "\"at\":\"%s:%d\"}\n",                                             \
            x, __FILE__, __LINE__);                                            \
    abort();                                                                   \
  } while (0)
