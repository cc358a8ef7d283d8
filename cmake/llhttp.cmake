# llhttp is packaged by Debian (node-llhttp) as C sources, not as a library: build them here.
find_path(LLHTTP_INCLUDE_DIR llhttp.h PATHS /usr/share/include/llhttp REQUIRED)
find_path(LLHTTP_SOURCE_DIR llhttp.c PATHS /usr/share/llhttp REQUIRED)
add_library(llhttp STATIC
  ${LLHTTP_SOURCE_DIR}/llhttp.c ${LLHTTP_SOURCE_DIR}/api.c ${LLHTTP_SOURCE_DIR}/http.c)
target_include_directories(llhttp SYSTEM PUBLIC ${LLHTTP_INCLUDE_DIR})
set_target_properties(llhttp PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_compile_options(llhttp PRIVATE -w)
