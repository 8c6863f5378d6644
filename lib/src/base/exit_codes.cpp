#include "ddp/exit_codes.h"

#include "ddp/error.h"

namespace ddp::exit_code {

int for_exception(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e)) return kConfig;
  if (dynamic_cast<const DataError*>(&e)) return kData;
  if (dynamic_cast<const StoreError*>(&e)) return kRendezvous;
  if (dynamic_cast<const CommError*>(&e)) return kComm;
  return kFailure;
}

}  // namespace ddp::exit_code
