// ddprun: a torchrun-compatible launcher. See `ddprun --help` and the README.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "agent.h"
#include "config/command_line.h"
#include "config/host_facts.h"
#include "config/launch_config.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "ddp/settings.h"
#include "supervision/signal_inbox.h"

int main(int argc, char** argv) {
  ddp::log::logger().set_pattern("[%H:%M:%S.%e] [ddprun] [%l] %v");
  try {
    const auto cli = ddprun::parse_command_line(std::vector<std::string>(argv, argv + argc));
    if (cli.help) {
      std::fputs(ddprun::help_text().c_str(), stdout);
      return ddp::exit_code::kSuccess;
    }
    if (cli.print_settings) {
      std::fputs(ddp::settings::effective_table().c_str(), stdout);
      std::fflush(stdout);
      ddp::settings::validate_all();  // a malformed value: its one-line error, a non-zero exit
      return ddp::exit_code::kSuccess;
    }
    // A malformed DDP_* value fails here, before any worker starts; workers read the same ones.
    ddp::settings::validate_all();
    const auto env = ddprun::current_environment();
    const auto host = ddprun::HostFacts::probe();
    const auto config = ddprun::resolve_launch_config(cli, env, host);
    // Before any thread exists (the store server), so that all of them keep the signals blocked.
    ddprun::SignalInbox inbox(config.signals_to_handle);
    return ddprun::run_agent(config, host, env, inbox);
  } catch (const std::exception& e) {
    ddp::log::error("{}", e.what());
    return ddp::exit_code::for_exception(e);
  }
}
