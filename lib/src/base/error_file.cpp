#include "ddp/error_file.h"

#include <ctime>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ddp/env_vars.h"
#include "ddp/error.h"

namespace ddp {

std::string error_kind(const std::exception& e) {
  // Most derived first: TimeoutError is a CommError.
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const CommError*>(&e)) return "CommError";
  if (dynamic_cast<const ConfigError*>(&e)) return "ConfigError";
  if (dynamic_cast<const StoreError*>(&e)) return "StoreError";
  if (dynamic_cast<const DataError*>(&e)) return "DataError";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "std::exception";
}

bool record_error(const std::exception& e) {
  try {
    const auto path = env::get("TORCHELASTIC_ERROR_FILE");
    if (!path || path->empty()) return true;
    const nlohmann::json doc = {
        {"message",
         {{"message", error_kind(e) + ": " + e.what()},
          {"extraInfo",
           {{"py_callstack", ""}, {"timestamp", std::to_string(std::time(nullptr))}}}}}};
    std::ofstream out(*path, std::ios::trunc);
    out << doc.dump() << "\n";
    return static_cast<bool>(out);
  } catch (...) {
    return false;
  }
}

}  // namespace ddp
