#pragma once
// The torchelastic error file: a launcher (torchrun, ddprun) sets TORCHELASTIC_ERROR_FILE for
// each worker and, when the worker fails, reads the file for the failure's message instead of
// guessing it from the stderr tail. Python workers write it with @record; C++ programs call
// record_error() where they catch what escaped their work (the examples' main() does).
#include <exception>
#include <string>

namespace ddp {

// Writes `e` as torchelastic's JSON ({"message": {"message": "<kind>: <what()>",
// "extraInfo": {"py_callstack": "", "timestamp": "<unix s>"}}}) to $TORCHELASTIC_ERROR_FILE.
// Does nothing when the variable is unset; returns false if the file could not be written
// (never throws: it runs while the program is already failing).
bool record_error(const std::exception& e);

// The name written before the message: "DataError", "CommError", ..., or "std::exception".
std::string error_kind(const std::exception& e);

}  // namespace ddp
