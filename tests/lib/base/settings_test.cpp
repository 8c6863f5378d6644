// The settings registry (ddp/settings.h): every declaration is complete, the readers check what
// they read, the sources of the library and ddprun read no DDP_* variable the registry lacks, and
// the README's table is the registry's.
#include "ddp/settings.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "scoped_env.h"

namespace ddp::settings {
namespace {

using testing::ScopedEnv;

const std::string kSourceDir = DDP_SOURCE_DIR;

// Unsets every setting, its fallback and every replaced name for the test's scope.
struct CleanSettings {
  std::vector<std::unique_ptr<ScopedEnv>> unset;
  CleanSettings() {
    for (const Setting* s : all()) {
      unset.push_back(std::make_unique<ScopedEnv>(s->name, nullptr));
      if (*s->fallback != '\0') unset.push_back(std::make_unique<ScopedEnv>(s->fallback, nullptr));
    }
    for (const auto& r : replaced())
      unset.push_back(std::make_unique<ScopedEnv>(r.old_name, nullptr));
  }
};

std::string thrown_by(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Settings, EveryDeclarationIsComplete) {
  std::set<std::string> names;
  for (const Setting* s : all()) {
    SCOPED_TRACE(s->name);
    const std::string name = s->name;
    // DDP_* for the library and the tests; DDPRUN_* for what ddprun or its Python backend reads.
    if (name.rfind("DDPRUN_", 0) == 0) {
      EXPECT_EQ(std::string(s->read_by).rfind("ddprun", 0), 0u);
    } else {
      EXPECT_EQ(name.rfind("DDP_", 0), 0u);
    }
    EXPECT_TRUE(names.insert(s->name).second) << "declared twice";
    EXPECT_GT(std::string(s->doc).size(), 20u);
    EXPECT_NE(std::string(s->default_text), "");
    EXPECT_NE(std::string(s->read_by), "");
    const bool ranged = s->type == Type::kInteger || s->type == Type::kBytes;
    if (ranged) {
      EXPECT_LE(s->min_value, s->max_value);
    }
    EXPECT_EQ(s->type == Type::kChoice, std::string(s->choices) != "");
  }
  for (const auto& r : replaced()) {
    EXPECT_EQ(names.count(r.old_name), 0u) << r.old_name << " is both a setting and replaced";
  }
}

TEST(Settings, IntegersAreCheckedAgainstTheirRange) {
  CleanSettings clean;
  EXPECT_EQ(integer(kPipelineDepth), std::nullopt);
  ScopedEnv depth("DDP_PIPELINE_DEPTH", "8");
  EXPECT_EQ(integer(kPipelineDepth), 8);
  {
    ScopedEnv too_deep("DDP_PIPELINE_DEPTH", "65");
    EXPECT_NE(thrown_by([] {
                integer(kPipelineDepth);
              }).find("DDP_PIPELINE_DEPTH=65 is out of range; expected a value in [1, 64]"),
              std::string::npos);
  }
  ScopedEnv words("DDP_TIMEOUT_SEC", "ten");
  EXPECT_NE(thrown_by([] { integer(kTimeoutSec); }).find("DDP_TIMEOUT_SEC='ten' is not an integer"),
            std::string::npos);
}

TEST(Settings, ChoicesListTheAcceptedSpellings) {
  CleanSettings clean;
  ScopedEnv level("DDP_LOG_LEVEL", "verbose");
  EXPECT_EQ(thrown_by([] { spelling(kLogLevel); }),
            "DDP_LOG_LEVEL='verbose' is not known; use trace, debug, info, warn, error, critical "
            "or off");
  ScopedEnv good("DDP_LOG_LEVEL", "debug");
  EXPECT_EQ(spelling(kLogLevel), "debug");
}

TEST(Settings, BooleansTakeTheUsualSpellings) {
  CleanSettings clean;
  EXPECT_EQ(boolean(kTestCpuBf16), std::nullopt);
  ScopedEnv yes("DDP_TEST_CPU_BF16", "on");
  EXPECT_EQ(boolean(kTestCpuBf16), true);
  ScopedEnv bad("DDP_TEST_CPU_BF16", "maybe");
  EXPECT_NE(thrown_by([] { boolean(kTestCpuBf16); }).find("is not a boolean"), std::string::npos);
}

TEST(Settings, TheFallbackIsReadOnlyWhenTheSettingIsUnset) {
  CleanSettings clean;
  ScopedEnv gloo("GLOO_SOCKET_IFNAME", "eth1");
  EXPECT_EQ(text(kSocketIfname), "eth1");
  ScopedEnv ours("DDP_SOCKET_IFNAME", "eth0");
  EXPECT_EQ(text(kSocketIfname), "eth0");
}

TEST(Settings, ValidateAllFindsAMalformedValueOrAReplacedName) {
  CleanSettings clean;
  EXPECT_NO_THROW(validate_all());
  {
    // Read only by the fabric backend, or only later: still refused at start.
    ScopedEnv order("DDP_RING_ORDER", "diagonal");
    EXPECT_NE(thrown_by(validate_all).find("DDP_RING_ORDER='diagonal'"), std::string::npos);
  }
  for (const auto& r : replaced()) {
    ScopedEnv old_name(r.old_name, "1");
    const std::string what = thrown_by(validate_all);
    EXPECT_NE(what.find(std::string(r.old_name) + " is no longer read; use"), std::string::npos)
        << what;
  }
}

TEST(Settings, EffectiveValuesNameTheirSource) {
  CleanSettings clean;
  ScopedEnv algorithm("DDP_ALGORITHM", "ring");
  ScopedEnv gloo("GLOO_SOCKET_IFNAME", "eth1");
  ScopedEnv chunk("DDP_CHUNK_BYTES", "12");  // below its minimum of 64
  for (const auto& row : effective()) {
    const std::string name = row.setting->name;
    if (name == "DDP_ALGORITHM") {
      EXPECT_EQ(row.value, "ring");
      EXPECT_EQ(row.source, "environment");
    } else if (name == "DDP_SOCKET_IFNAME") {
      EXPECT_EQ(row.value, "eth1");
      EXPECT_EQ(row.source, "GLOO_SOCKET_IFNAME");
    } else if (name == "DDP_CHUNK_BYTES") {
      EXPECT_EQ(row.value, "12");
      EXPECT_NE(row.error.find("out of range"), std::string::npos) << row.error;
    } else {
      EXPECT_EQ(row.source, "default") << name;
      EXPECT_EQ(row.value, row.setting->default_text) << name;
      EXPECT_EQ(row.error, "") << name;
    }
  }
}

// Every "DDP_..." and "DDPRUN_..." string in the sources of the library (its Python package
// included), ddprun and the examples is a declared setting or a replaced name: a variable read
// behind the registry's back fails here.
TEST(Settings, TheSourcesReadNoUndeclaredVariable) {
  std::set<std::string> known;
  for (const Setting* s : all()) known.insert(s->name);
  for (const auto& r : replaced()) known.insert(r.old_name);
  const std::regex quoted("[\"'](DDP(?:RUN)?_[A-Z0-9_]+)");
  int files = 0;
  for (const char* folder : {"lib", "launcher", "examples"}) {
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(kSourceDir + "/" + folder)) {
      const auto ext = entry.path().extension();
      if (ext != ".cpp" && ext != ".h" && ext != ".py") continue;
      ++files;
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      const std::string source = text.str();
      for (std::sregex_iterator it(source.begin(), source.end(), quoted), end; it != end; ++it) {
        EXPECT_EQ(known.count((*it)[1]), 1u)
            << (*it)[1] << " in " << entry.path() << " is not declared in ddp/settings.h";
      }
    }
  }
  EXPECT_GT(files, 50);
}

// Settings whose default their reader computes (no typed default): the C++ name, and the
// variable. Every other setting's default_text is a plain value of its type.
const std::vector<std::pair<std::string, std::string>> kComputedDefaults = {
    {"kSocketIfname", "DDP_SOCKET_IFNAME"},
    {"kFabricProvider", "DDP_FABRIC_PROVIDER"},
    {"kDirectBytes", "DDP_DIRECT_BYTES"},
    {"kRingThreshold", "DDP_RING_THRESHOLD"},
    {"kChunkBytes", "DDP_CHUNK_BYTES"},
    {"kPipelineDepth", "DDP_PIPELINE_DEPTH"},
    {"kHierarchySliceBytes", "DDP_HIERARCHY_SLICE_BYTES"},
    {"kHierarchyPieceBytes", "DDP_HIERARCHY_PIECE_BYTES"},
    {"kIsa", "DDP_ISA"},
    {"kTraceDir", "DDP_TRACE_DIR"},
    {"kDoctorShmBytes", "DDP_DOCTOR_SHM_BYTES"},
    {"kTestCpuBf16", "DDP_TEST_CPU_BF16"},
};

// A typed default is declared once, in default_text: each one parses as its setting's type and
// lies within its range or choices; the others are the computed ones listed above.
TEST(Settings, EveryPlainDefaultIsATypedDefault) {
  std::set<std::string> computed;
  for (const auto& entry : kComputedDefaults) computed.insert(entry.second);
  std::vector<std::string> missing_in_list;
  for (const Setting* s : all()) {
    if (s->type == Type::kText) {
      EXPECT_FALSE(has_typed_default(*s)) << s->name;
      continue;
    }
    if (computed.count(s->name) != 0) {
      EXPECT_FALSE(has_typed_default(*s))
          << s->name << "'s default '" << s->default_text
          << "' is a plain value now: take it off kComputedDefaults and read it with *_or_default";
    } else {
      EXPECT_TRUE(has_typed_default(*s))
          << s->name << "'s default '" << s->default_text
          << "' is not a value of its type: fix it, or list the setting in kComputedDefaults";
    }
  }
}

TEST(Settings, OrDefaultReadersGiveTheDeclaredDefaultWhenUnset) {
  CleanSettings clean;
  EXPECT_EQ(integer_or_default(kTimeoutSec), 1800);
  EXPECT_EQ(integer_or_default(kDoctorMinMbps), 0);  // "0 (links are judged ...)"
  EXPECT_EQ(spelling_or_default(kBackend), "gloo");
  {
    ScopedEnv set("DDP_TIMEOUT_SEC", "7");
    EXPECT_EQ(integer_or_default(kTimeoutSec), 7);
  }
  {
    ScopedEnv set("DDP_TIMEOUT_SEC", "0");
    EXPECT_THROW(integer_or_default(kTimeoutSec), ConfigError);
  }
  EXPECT_THROW(integer_or_default(kChunkBytes), std::logic_error);
  EXPECT_THROW(boolean_or_default(kTestCpuBf16), std::logic_error);
}

// A reader that supplies its own default where the registry declares one would repeat it (and
// could disagree): only the settings with computed defaults are read with value_or.
TEST(Settings, TheSourcesRepeatNoTypedDefault) {
  std::set<std::string> computed;
  for (const auto& entry : kComputedDefaults) computed.insert(entry.first);
  const std::regex read_with_default(
      R"(settings::(?:integer|boolean|spelling|text|bytes)\(\s*(?:ddp::)?settings::(k\w+)\s*\)\s*\.value_or)");
  int reads = 0;
  for (const char* folder : {"lib", "launcher", "examples"}) {
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(kSourceDir + "/" + folder)) {
      const auto ext = entry.path().extension();
      if (ext != ".cpp" && ext != ".h") continue;
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      const std::string source = text.str();
      for (std::sregex_iterator it(source.begin(), source.end(), read_with_default), end; it != end;
           ++it) {
        ++reads;
        EXPECT_EQ(computed.count((*it)[1]), 1u)
            << (*it)[1] << " in " << entry.path()
            << " is read with value_or, but ddp/settings.h declares its default: use "
               "*_or_default";
      }
    }
  }
  EXPECT_GT(reads, 0) << "the pattern found no read at all: it no longer matches the sources";
}

// The README's table is generated from the registry.
TEST(Settings, TheReadmeTableIsTheRegistrys) {
  std::ifstream in(kSourceDir + "/README.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const std::string begin = "<!-- settings table: begin -->\n";
  const std::string end = "<!-- settings table: end -->";
  const auto from = readme.find(begin);
  const auto to = readme.find(end);
  ASSERT_NE(from, std::string::npos) << "README.md has no settings table";
  ASSERT_NE(to, std::string::npos);
  const std::string table = readme.substr(from + begin.size(), to - from - begin.size());
  const std::string expected = markdown_table();
  if (table != expected) {
    const std::string path = std::filesystem::current_path() / "settings-table.md";
    std::ofstream(path) << expected;
    ADD_FAILURE() << "README.md's settings table differs from ddp/settings.h; replace the lines "
                     "between its markers with "
                  << path;
  }
}

}  // namespace
}  // namespace ddp::settings
