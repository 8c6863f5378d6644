#pragma once
// ddprun's command line: torchrun's flags (dash and underscore spellings), then the program and
// its arguments. Parsing only splits and validates the syntax; meaning is given by
// launch_config.h, which also merges in the PET_* environment defaults.
#include <map>
#include <string>
#include <vector>

namespace ddprun {

struct FlagSpec {
  const char* name;        // canonical long name with dashes, e.g. "nproc-per-node"
  const char* short_name;  // "" when there is none
  bool takes_value;        // false: a switch
  const char* default_text;
  const char* help;
};

// Every flag ddprun accepts, in --help order.
const std::vector<FlagSpec>& flag_specs();

// "nproc-per-node" -> "PET_NPROC_PER_NODE": the environment default torchrun reads for a flag.
std::string pet_env_name(const std::string& flag);

struct CommandLine {
  // Flags given explicitly, by canonical name; switches map to "true" or "false".
  std::map<std::string, std::string> given;
  // The program to run and its arguments (everything after the first non-flag or "--").
  std::vector<std::string> program;
  bool help = false;
  bool print_settings = false;
  // `ddprun [OPTION...] doctor [PROGRAM...]` or `ddprun doctor [OPTION...] [PROGRAM...]`: check
  // the nodes instead of running the program (doctor.h).
  bool doctor = false;
};

// argv[0] is ddprun itself. Throws ddp::ConfigError for an unknown flag or a missing value.
CommandLine parse_command_line(const std::vector<std::string>& argv);

// The --help text.
std::string help_text();

}  // namespace ddprun
