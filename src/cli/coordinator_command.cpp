#include <iostream>
#include <memory>

#include <meshtensor/ft/coordinator.hpp>

#include "commands.hpp"

namespace meshtensor::cli {

void add_coordinator_command(CLI::App& app) {
  auto config = std::make_shared<ft::CoordinatorConfig>();
  CLI::App* command = app.add_subcommand(
      "coordinator",
      "The coordinator of a fault-tolerant run: the replica groups' heartbeats, per-step quorum "
      "and rendezvous (docs/fault-tolerance.md)");
  command->add_option("--port", config->port, "TCP port to listen on (0: any free one)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  command->add_option("--host", config->host, "IPv4 address to listen on")->capture_default_str();
  command
      ->add_option("--heartbeat-timeout", config->rules.heartbeat_timeout,
                   "seconds without a heartbeat after which a group is dropped")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  command
      ->add_option("--quorum-wait", config->rules.quorum_wait,
                   "seconds a round waits for live groups that have not asked yet")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  command->callback([config] { ft::serve_until_signalled(*config, std::cout); });
}

}  // namespace meshtensor::cli
