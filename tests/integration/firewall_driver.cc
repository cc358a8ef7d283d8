// Test-only driver for tests/integration/test_runner_firewall.py: arms egress `firewall` for
// an existing netns exactly as the podman backend does (firewall::arm()), prints one JSON line
// with what it made, waits for EOF on stdin, tears down and prints a second line.
//
//   firewall_driver ID NETNS [ALLOW...]     (ID: 1..12 of [a-z0-9]; NETNS under /run/netns)
//   firewall_driver --reap ID               (firewall::reap(), as gc does)
//
// Exit status: 0 after a clean teardown, 1 if arm() refused (its message on stderr).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/log.h"
#include "compass-runner/backend.h"
#include "compass-runner/firewall.h"

int main(int argc, char** argv) {
  common::log::init("firewall_driver", common::log::Level::kInfo);
  if (argc == 3 && std::string(argv[1]) == "--reap") {
    runner::firewall::reap(argv[2]);
    std::cout << nlohmann::json{{"reaped", argv[2]}}.dump() << std::endl;
    return 0;
  }
  if (argc < 3) {
    std::cerr << "usage: firewall_driver ID NETNS [ALLOW...] | firewall_driver --reap ID\n";
    return 2;
  }
  const std::vector<std::string> allow(argv + 3, argv + argc);
  std::unique_ptr<runner::firewall::Egress> egress;
  try {
    egress = runner::firewall::arm(argv[1], argv[2], allow);
  } catch (const runner::RunnerError& e) {
    std::cerr << "firewall_driver: " << e.what() << std::endl;
    return 1;
  }
  std::cout << nlohmann::json{{"resolver4", egress->resolverAddress()},
                              {"resolver6", egress->resolverAddress6()},
                              {"veth", egress->hostVeth()}}
                   .dump()
            << std::endl;
  char buf[256];
  while (::read(STDIN_FILENO, buf, sizeof buf) > 0) {
  }
  egress->teardown();
  std::cout << nlohmann::json{{"down", true}}.dump() << std::endl;
  return 0;
}
