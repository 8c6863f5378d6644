#include "ddp/settings.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "ddp/env_vars.h"
#include "ddp/error.h"

namespace ddp::settings {
namespace {

std::vector<std::string> split_choices(const char* choices) {
  std::vector<std::string> spellings;
  std::string current;
  for (const char* c = choices; *c != '\0'; ++c) {
    if (*c == '|') {
      spellings.push_back(current);
      current.clear();
    } else {
      current += *c;
    }
  }
  spellings.push_back(current);
  return spellings;
}

std::string type_text(const Setting& s) {
  switch (s.type) {
    case Type::kInteger:
      return "integer " + std::to_string(s.min_value) + "-" + std::to_string(s.max_value);
    case Type::kBytes:
      return "bytes " + std::to_string(s.min_value) + "-" + std::to_string(s.max_value);
    case Type::kBoolean:
      return "boolean";
    case Type::kChoice: {
      std::string text;
      for (const auto& spelling : split_choices(s.choices)) {
        text += (text.empty() ? "" : ", ") + spelling;
      }
      return text;
    }
    case Type::kText:
      return "text";
  }
  return "";
}

// The checked value of one setting, as text; nullopt when unset.
std::optional<std::string> checked(const Setting& s) {
  switch (s.type) {
    case Type::kInteger:
    case Type::kBytes: {
      auto v = integer(s);
      return v ? std::optional<std::string>(std::to_string(*v)) : std::nullopt;
    }
    case Type::kBoolean: {
      auto v = boolean(s);
      return v ? std::optional<std::string>(*v ? "true" : "false") : std::nullopt;
    }
    case Type::kChoice:
      return spelling(s);
    case Type::kText:
      return text(s);
  }
  return std::nullopt;
}

}  // namespace

const std::vector<const Setting*>& all() {
  static const std::vector<const Setting*> settings{&kBackend,
                                                    &kTimeoutSec,
                                                    &kSocketIfname,
                                                    &kFabricProvider,
                                                    &kCollectives,
                                                    &kAlgorithm,
                                                    &kDirectBytes,
                                                    &kRingThreshold,
                                                    &kChunkBytes,
                                                    &kPipelineDepth,
                                                    &kRingOrder,
                                                    &kHierarchySliceBytes,
                                                    &kHierarchyPieceBytes,
                                                    &kHangWarnSec,
                                                    &kPyStackSignal,
                                                    &kFlightRecorderEntries,
                                                    &kFlightRecorderFile,
                                                    &kLiveMetricsFile,
                                                    &kAbortFile,
                                                    &kRegroupFile,
                                                    &kRegroupWaitSec,
                                                    &kStoreProtocol,
                                                    &kIsa,
                                                    &kLogLevel,
                                                    &kStragglerWindow,
                                                    &kStragglerPercent,
                                                    &kTraceDir,
                                                    &kNnodes,
                                                    &kTorchCollectives,
                                                    &kPythonHook,
                                                    &kDoctorShmBytes,
                                                    &kDoctorTransferMs,
                                                    &kDoctorMinMbps,
                                                    &kDoctorSweepFile,
                                                    &kRdzvTokenFile,
                                                    &kRegroup,
                                                    &kTorchLib,
                                                    &kTestHostId,
                                                    &kTestCpuBf16,
                                                    &kTestStepDelayMs};
  return settings;
}

const std::vector<Replaced>& replaced() {
  static const std::vector<Replaced> names{
      {"DDP_GLOO_ALGORITHM",
       "DDP_ALGORITHM=auto|direct|ring|recursive_doubling (gloo's own gloo_ring and bcube are "
       "gone; bench/ keeps them as references)"},
      {"DDP_FABRIC_ALGORITHM", "DDP_ALGORITHM"},
      {"DDP_FABRIC_RING_THRESHOLD", "DDP_RING_THRESHOLD"},
      {"DDP_FABRIC_CHUNK_BYTES", "DDP_CHUNK_BYTES"},
      {"DDP_FABRIC_PIPELINE_DEPTH", "DDP_PIPELINE_DEPTH"},
      {"DDP_FABRIC_RING_ORDER", "DDP_RING_ORDER"},
      {"DDP_REDUCE_ISA", "DDP_ISA=baseline|avx2|avx512|sve (one cap for every kernel)"},
      {"DDP_KERNEL_ISA", "DDP_ISA=baseline|avx2|avx512|sve (one cap for every kernel)"},
  };
  return names;
}

std::optional<std::string> text(const Setting& setting) {
  if (auto value = env::get(setting.name)) return value;
  if (*setting.fallback != '\0') return env::get(setting.fallback);
  return std::nullopt;
}

std::optional<long> integer(const Setting& setting) {
  auto value = text(setting);
  if (!value) return std::nullopt;
  return env::parse_int(setting.name, *value, setting.min_value, setting.max_value);
}

std::optional<bool> boolean(const Setting& setting) {
  auto value = text(setting);
  if (!value) return std::nullopt;
  return env::parse_bool(setting.name, *value);
}

std::optional<std::string> spelling(const Setting& setting) {
  auto value = text(setting);
  if (!value) return std::nullopt;
  const auto spellings = split_choices(setting.choices);
  for (const auto& accepted : spellings) {
    if (*value == accepted) return value;
  }
  env::unknown_choice(setting.name, *value, spellings);
}

namespace {

// default_text without a trailing note in parentheses: "0 (links ...)" -> "0".
std::string plain_default(const Setting& setting) {
  std::string value = setting.default_text;
  const auto note = value.find(" (");
  if (note != std::string::npos && value.back() == ')') value.erase(note);
  return value;
}

[[noreturn]] void no_typed_default(const Setting& setting) {
  throw std::logic_error(std::string(setting.name) + " declares no typed default ('" +
                         setting.default_text + "'); its reader must compute it");
}

}  // namespace

bool has_typed_default(const Setting& setting) {
  const std::string value = plain_default(setting);
  try {
    switch (setting.type) {
      case Type::kInteger:
      case Type::kBytes:
        (void)env::parse_int(setting.name, value, setting.min_value, setting.max_value);
        return true;
      case Type::kBoolean:
        (void)env::parse_bool(setting.name, value);
        return true;
      case Type::kChoice: {
        const auto spellings = split_choices(setting.choices);
        return std::find(spellings.begin(), spellings.end(), value) != spellings.end();
      }
      case Type::kText:
        return false;
    }
  } catch (const ConfigError&) {
  }
  return false;
}

long integer_or_default(const Setting& setting) {
  if (auto value = integer(setting)) return *value;
  if (!has_typed_default(setting)) no_typed_default(setting);
  return env::parse_int(setting.name, plain_default(setting), setting.min_value, setting.max_value);
}

bool boolean_or_default(const Setting& setting) {
  if (auto value = boolean(setting)) return *value;
  if (!has_typed_default(setting)) no_typed_default(setting);
  return env::parse_bool(setting.name, plain_default(setting));
}

std::string spelling_or_default(const Setting& setting) {
  if (auto value = spelling(setting)) return *value;
  if (!has_typed_default(setting)) no_typed_default(setting);
  return plain_default(setting);
}

void detail::unmapped_spelling(const Setting& setting, const std::string& spelling) {
  throw ConfigError(std::string(setting.name) + "='" + spelling +
                    "' is declared in ddp/settings.h but not handled by its reader");
}

void refuse_replaced() {
  for (const auto& [old_name, successor] : replaced()) {
    if (env::get(old_name)) {
      throw ConfigError(std::string(old_name) + " is no longer read; use " + successor);
    }
  }
}

void validate_all() {
  refuse_replaced();
  for (const Setting* setting : all()) (void)checked(*setting);
}

std::vector<Effective> effective() {
  std::vector<Effective> rows;
  for (const Setting* setting : all()) {
    Effective row{setting, setting->default_text, "default", ""};
    const auto raw = text(*setting);
    if (raw) row.source = env::get(setting->name) ? "environment" : setting->fallback;
    try {
      if (auto value = checked(*setting)) row.value = *value;
    } catch (const ConfigError& e) {
      row.value = raw.value_or("");
      row.error = e.what();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

namespace {

// A table cell: '|' would end it.
std::string cell(const std::string& text) {
  std::string escaped;
  for (char c : text) {
    if (c == '|') escaped += '\\';
    escaped += c;
  }
  return escaped;
}

}  // namespace

std::string markdown_table() {
  std::ostringstream out;
  out << "| Variable | Values | Default | Read by | What it does |\n";
  out << "|---|---|---|---|---|\n";
  for (const Setting* s : all()) {
    std::string doc = s->doc;
    if (*s->fallback != '\0') doc += " Unset, " + std::string(s->fallback) + " is read.";
    out << "| `" << s->name << "` | " << cell(type_text(*s)) << " | " << cell(s->default_text)
        << " | " << s->read_by << " | " << cell(doc) << " |\n";
  }
  for (const auto& [old_name, successor] : replaced()) {
    out << "| `" << old_name << "` | refused | | | Replaced by " << cell(successor) << ". |\n";
  }
  return out.str();
}

std::string effective_table() {
  const auto rows = effective();
  std::size_t width = 0;
  for (const auto& row : rows) width = std::max(width, std::string(row.setting->name).size());
  std::ostringstream out;
  for (const auto& row : rows) {
    std::string name = row.setting->name;
    out << name << std::string(width + 2 - name.size(), ' ') << row.value << "  ("
        << (row.error.empty() ? row.source : "invalid: " + row.error) << ")\n";
  }
  for (const auto& [old_name, successor] : replaced()) {
    if (env::get(old_name)) {
      out << old_name << "  (invalid: no longer read; use " << successor << ")\n";
    }
  }
  return out.str();
}

}  // namespace ddp::settings
