# Only the pure answer logic and the nft text it uses: the fuzzer needs neither the runner's
# sockets and threads nor the rest of runner_lib (whose coroutines clang's fuzz build lacks).
if(NOT TARGET firewall_dns_answer)
  add_library(firewall_dns_answer STATIC ${PROJECT_SOURCE_DIR}/src/compass-runner/dns_answer.cc
                                         ${PROJECT_SOURCE_DIR}/src/compass-runner/ruleset.cc)
  target_include_directories(firewall_dns_answer PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(firewall_dns_answer PUBLIC policy resolv)
endif()
set(FUZZ_LIBS firewall_dns_answer)
