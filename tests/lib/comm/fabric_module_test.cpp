// libddp_comm loads its fabric module only when the module was built from the same sources: the
// entry point's name carries a hash of the headers both are compiled against.
#include <gtest/gtest.h>

#include <string>

#include "comm/fabric_module.h"
#include "ddp/error.h"

namespace ddp::detail {
namespace {

TEST(FabricModule, TheModuleOfThisBuildLoads) {
  EXPECT_NE(load_fabric_entry_point(DDP_TEST_FABRIC_MODULE), nullptr);
}

TEST(FabricModule, AModuleFromOtherSourcesIsRefusedClearly) {
  try {
    load_fabric_entry_point(DDP_TEST_STALE_MODULE);
    FAIL() << "a module without this build's entry point was accepted";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("built from other sources than this libddp_comm"), std::string::npos)
        << message;
    EXPECT_NE(message.find("rebuild or reinstall libddp_comm and libddp_fabric together"),
              std::string::npos)
        << message;
  }
}

TEST(FabricModule, AMissingFileNamesTheFix) {
  try {
    load_fabric_entry_point("/nonexistent/libddp_fabric.so.0");
    FAIL() << "a missing module was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_BACKEND=gloo"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::detail
