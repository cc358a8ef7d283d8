# lwIP 2.1.3's core as a static library with our lwipopts.h (DESIGN.md "Static lwIP recipe"):
# nano-init must be one static binary, so Debian's shared liblwip cannot be used. The source
# comes from Debian's source package, which scripts/install-deps unpacks into LWIP_DIR; the
# file lists are the source tree's own Filelists.cmake, so nothing of lwIP is copied here.
set(LWIP_DIR /usr/local/src/compass/lwip CACHE PATH "lwIP 2.1.3 source tree (scripts/install-deps)")
if(NOT EXISTS ${LWIP_DIR}/src/Filelists.cmake)
  message(FATAL_ERROR
    "lwIP source not found in ${LWIP_DIR} (no src/Filelists.cmake). nano-init's network stack "
    "links lwIP statically from Debian's lwip source package: run `sudo scripts/install-deps` "
    "first, or pass -DLWIP_DIR=<an unpacked lwip 2.1.3 source tree>.")
endif()
# Filelists.cmake also looks for Doxygen to build lwIP's manual (an ALL target if found) and
# says so when it is missing: neither is ours, so Doxygen is not looked for and its notice
# not shown.
set(CMAKE_DISABLE_FIND_PACKAGE_Doxygen TRUE)
set(CMAKE_MESSAGE_LOG_LEVEL WARNING)
include(${LWIP_DIR}/src/Filelists.cmake)
unset(CMAKE_MESSAGE_LOG_LEVEL)
unset(CMAKE_DISABLE_FIND_PACKAGE_Doxygen)

# Our port: lwipopts.h, arch/cc.h (src/netstack/lwip) and sys_now() (netstack's sys_arch.cc).
add_library(lwip_core STATIC ${lwipcore_SRCS} ${lwipcore4_SRCS} ${lwipcore6_SRCS})
target_include_directories(lwip_core SYSTEM PUBLIC
  ${PROJECT_SOURCE_DIR}/src/netstack/lwip ${LWIP_DIR}/src/include)
# lwIP is third-party C: its own warnings are not ours to fix.
target_compile_options(lwip_core PRIVATE -w)
